import pytest
import torch

from devcourse.explorer import MAP_LOCATIONS, explore, fixture_bytes, map_location_explorer

NO_GPU = not torch.cuda.is_available()


def test_every_choice_on_a_cpu_checkpoint_lists_tensors():
    for choice in MAP_LOCATIONS:
        lines = explore("cpu", choice).splitlines()
        assert lines[0] == f"torch.load(<saved on cpu>, map_location={choice}, weights_only=True)"
        assert any("encoder.0.weight" in line for line in lines), choice


@pytest.mark.skipif(not NO_GPU, reason="the error is a CPU-only machine's")
@pytest.mark.parametrize("choice", ["None", "{'cuda:0': 'cpu'}"])
def test_choices_that_leave_a_cuda_tag_show_the_real_error(choice):
    text = explore("cuda:1", choice)
    assert "RuntimeError: Attempting to deserialize object on a CUDA device" in text
    assert "encoder.0.weight" not in text


@pytest.mark.parametrize(
    "choice, device", [("'cpu'", "cpu"), ("{'cuda:1': 'cpu'}", "cpu"), ("'meta'", "meta")]
)
def test_choices_that_map_the_tag_put_every_tensor_there(choice, device):
    lines = explore("cuda:1", choice).splitlines()[1:]
    assert len(lines) == 9 and all(line.split()[1] == device for line in lines)


def test_the_callable_sees_the_saved_device_tag():
    assert "the callable received location=['cuda:1']" in explore(
        "cuda:1", "lambda storage, location: storage"
    )


def test_unknown_choices_are_refused():
    with pytest.raises(ValueError):
        explore("cuda:1", "'gpu'")
    with pytest.raises(ValueError):
        fixture_bytes("cuda:7")


def test_widget_updates_when_a_choice_changes():
    panel = map_location_explorer()
    (saved_on, choice), result = panel.children[0].children, panel.children[1]
    choice.value = "'meta'"
    assert "meta" in result.value and "saved on cuda:1" in result.value
    saved_on.value = "cpu"
    assert "saved on cpu" in result.value


def test_widget_shows_the_result_of_the_choices_it_ends_with(monkeypatch):
    """JupyterLab may deliver a second change while the first one's result is computed.

    The kernel then handles both at once, and the slower, older result must not
    be the one left on display.
    """
    from html import escape

    from devcourse import explorer

    panel = map_location_explorer()
    (saved_on, choice), result = panel.children[0].children, panel.children[1]
    real = explorer.explore

    def explore_while_the_choice_changes(where, how):
        text = real(where, how)
        if (where, how) == ("cuda:0", "None"):
            choice.value = "'meta'"  # the second change, handled before the first returns
        return text

    monkeypatch.setattr(explorer, "explore", explore_while_the_choice_changes)
    saved_on.value = "cuda:0"
    assert result.value == f"<pre>{escape(real('cuda:0', repr('meta')))}</pre>"


def test_a_killed_kernel_leaves_no_checkpoint_behind(tmp_path):
    import os
    import subprocess
    import sys

    # explore, then end as a kernel killed outright does (nbval's, a lost laptop's): no exit handler
    # runs
    subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import os, signal\nfrom devcourse.explorer import explore\n"
                "print(explore('cuda:1', \"'cpu'\"))\nos.kill(os.getpid(), signal.SIGKILL)"
            ),
        ],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert list(tmp_path.iterdir()) == []
