"""The slow loops' progress bar: text outside a kernel, tqdm's widget inside one, whose text copy
ends at 100%."""

import nbformat
from nbclient import NotebookClient

from devcourse.progress import steps


def test_outside_a_kernel_the_bar_is_text_and_every_item_comes_through(capsys):
    assert list(steps(["a", "b", "c"], "three letters")) == ["a", "b", "c"]
    err = capsys.readouterr().err
    assert "three letters" in err and "3/3" in err, err


def test_in_a_kernel_the_bar_is_a_widget_that_carries_its_text(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from devcourse.progress import steps\nprint(sum(steps(range(4), 'counting')))"
        )
    ]
    NotebookClient(
        nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = nb.cells[0].outputs
    bars = [
        o
        for o in outputs
        if o.output_type == "display_data"
        and "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert bars, outputs
    assert "counting" in bars[0].data["text/plain"] and "4/4" in bars[0].data["text/plain"], bars[
        0
    ].data
    assert any(o.output_type == "stream" and o.text == "6\n" for o in outputs), outputs
