"""No source file of the package over 600 lines: one concept per file (Python, C++ and headers alike)."""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "torchrl_muzero"
LIMIT = 600


def test_no_source_file_over_the_limit():
    sizes = {p.relative_to(ROOT.parent): len(p.read_text().splitlines())
             for ext in ("*.py", "*.cpp", "*.h") for p in ROOT.rglob(ext)}
    assert len(sizes) > 50, "the walk found too few files: is ROOT right?"
    over = sorted((n, str(p)) for p, n in sizes.items() if n > LIMIT)
    assert not over, f"files over {LIMIT} lines (split them by concept): {over}"
