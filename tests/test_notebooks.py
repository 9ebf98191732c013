"""The docs notebooks run end to end (nbclient), so they can never go stale."""

import pathlib

import pytest
from _env import python_path

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
NOTEBOOKS = sorted(DOCS.glob("*.ipynb"))


@pytest.mark.loopback  # the kernel talks to its client over ZMQ on 127.0.0.1
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (test extra)")
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (test extra)")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (test extra)")
    pytest.importorskip("matplotlib", reason="the notebook plots (bench extra)")
    monkeypatch.setenv("PYTHONPATH", python_path())  # the kernel imports this checkout's nbjit
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend: figures
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    text = "\n".join(output.get("text", "") or output.get("data", {}).get("text/plain", "")
                     for cell in notebook.cells for output in cell.get("outputs", []))
    if path.name == "observability.ipynb":
        assert "nbjit cache miss of train_step (" in text  # named with its definition site
        assert "static argument value 0.05 -> 0.01" in text
        assert "profiler overhead" in text and "median (p90)" in text
        assert "miss s  misses  function" in text  # the ranked misses
        assert "x: shape, y: shape" in text
        assert "AssertionError: 2 nbjit cache misses, at most 1 allowed" in text
        assert "self-check (jax.jit against itself)" in text and "verdict: " in text
        compare_cell = next(c for c in notebook.cells
                            if c.cell_type == "code" and "nbjit.compare(" in c.source)
        shown = [o.get("data", {}) for o in compare_cell.outputs]
        assert any("verdict" in d.get("text/html", "") and "self-check" in d.get("text/html", "")
                   for d in shown), "the notebook's display of compare's result"
        plot_cell = next(c for c in notebook.cells if "prof.plot()" in c.source)
        assert any("image/png" in o.get("data", {}) for o in plot_cell.outputs), \
            "prof.plot() drew no figure in the notebook's outputs"
