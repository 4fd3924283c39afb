"""`python -m pagesim`: the `pagesim` command, for a checkout that is not installed (a GPU
host with the source on `PYTHONPATH`)."""

from pagesim.cli.app import console

if __name__ == "__main__":
    console()
