"""Requests that can never be served are refused when they arrive, with a reason.

What vLLM's OpenAI server refuses (it answers HTTP 400 and the engine never sees the request):
an empty prompt, `max_tokens < 1`, a prompt longer than `max_model_len`, and
`prompt + max_tokens > max_model_len` when `max_tokens` is given (the server does not cap an
explicit `max_tokens`; `vllm bench serve` always gives it). pagesim refuses the same, and also a
request whose K/V could not fit even in an empty cache (vLLM checks that only for
`max_model_len` at start-up; a workload may still carry such a request).

A reason is `"<code>: <detail>"`; metrics group by the code before the colon.
"""

from __future__ import annotations

from collections.abc import Callable

from pagesim.request import Request


def reject_reason(
    request: Request, max_model_len: int, can_fit: Callable[[Request], bool] | None
) -> str | None:
    """Why `request` can never be served, or None if it can.

    `can_fit(request)` says whether the request, once it has all its tokens, could hold its
    K/V in an otherwise empty cache (see `kv_fit_check`; None: no limit known).
    """
    num_prompt = len(request.prompt_token_ids)
    max_tokens = request.max_tokens
    if num_prompt == 0:
        return "empty_prompt: the prompt has no tokens"
    if max_tokens < 1:
        return f"invalid_max_tokens: max_tokens={max_tokens} must be >= 1"
    if num_prompt > max_model_len:
        return (
            f"prompt_too_long: prompt of {num_prompt} tokens is longer than "
            f"max_model_len={max_model_len}"
        )
    if num_prompt + max_tokens > max_model_len:
        return (
            f"max_tokens_too_large: prompt {num_prompt} + max_tokens {max_tokens} "
            f"exceeds max_model_len={max_model_len}"
        )
    if can_fit is not None and not can_fit(request):
        return (
            f"kv_cache_too_small: prompt {num_prompt} + max_tokens {max_tokens} "
            "cannot fit in the whole KV cache"
        )
    return None


def kv_fit_check(kv_cache_manager) -> Callable[[Request], bool] | None:
    """The manager's test of whether a request could ever fit, as a function of the request.

    A contiguous baseline sizes its region from `prompt + max_tokens` (`can_fit_request`);
    the paged manager's `can_fit(num_tokens)` takes the slots a finished request has written,
    `prompt + max_tokens - 1`: the last sampled token is returned but never fed back.
    """
    per_request = getattr(kv_cache_manager, "can_fit_request", None)
    if per_request is not None:
        return per_request
    per_tokens = getattr(kv_cache_manager, "can_fit", None)
    if per_tokens is None:
        return None
    return lambda r: per_tokens(len(r.prompt_token_ids) + r.max_tokens - 1)
