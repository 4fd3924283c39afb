"""pagesim.utils: the helpers every command shares."""


def test_readable_figures_group_thousands_and_never_use_exponents_there() -> None:
    from pagesim.utils import readable

    assert readable(18575.4) == "18,575"
    assert readable(24.853) == "24.85"
    assert readable(0.2046) == "0.2046"
    assert readable(0) == "0"
    assert readable(float("nan")) == "nan"
