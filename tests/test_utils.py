"""pagesim.utils: the helpers every command shares."""


def test_readable_figures_group_thousands_and_never_use_exponents_there() -> None:
    from pagesim.utils import readable

    assert readable(18575.4) == "18,575"
    assert readable(24.853) == "24.85"
    assert readable(0.2046) == "0.2046"
    assert readable(0) == "0"
    assert readable(float("nan")) == "nan"


def test_atomic_writes_leave_files_as_open_as_a_plain_write(tmp_path) -> None:
    import os

    from pagesim.utils import atomic_write_text, write_new_file

    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic_write_text(tmp_path / "atomic.txt", "x")
    assert write_new_file(tmp_path / "new.txt", b"x")
    mode = os.stat(plain).st_mode & 0o777
    assert os.stat(tmp_path / "atomic.txt").st_mode & 0o777 == mode
    assert os.stat(tmp_path / "new.txt").st_mode & 0o777 == mode
