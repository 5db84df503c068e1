import torch

from devcourse.envreport import CudaDevice, EnvFacts, collect_facts, report_widget, smoke_test


def _facts(**changes):
    base = dict(
        python_version="3.11.7",
        platform="Linux",
        torch_version="2.13.0+cu128",
        cuda_build="12.8",
        cuda_available=True,
        device_count=2,
        cuda_visible_devices="0,1",
        cuda_devices=(CudaDevice(0, "GPU A", 79.6, (9, 0)), CudaDevice(1, "GPU B", 79.6, (9, 0))),
    )
    base.update(changes)
    return EnvFacts(**base)


def test_collect_facts_agrees_with_torch():
    facts = collect_facts()
    assert facts.torch_version == torch.__version__
    assert facts.cuda_build == torch.version.cuda
    assert facts.cuda_available == torch.cuda.is_available()
    assert len(facts.cuda_devices) == facts.device_count
    assert facts.devices()[0] == torch.device("cpu")


def test_text_report_names_every_gpu():
    text = _facts().to_text()
    assert "CUDA build            12.8" in text
    assert "cuda:1                GPU B, 79.6 GiB, compute capability 9.0" in text
    assert "CUDA_VISIBLE_DEVICES  '0,1'" in text


def test_text_report_of_a_cpu_only_build_says_so():
    text = _facts(
        cuda_build=None,
        cuda_available=False,
        device_count=0,
        cuda_devices=(),
        cuda_visible_devices=None,
    ).to_text()
    assert "none (CPU-only build)" in text
    assert "CUDA_VISIBLE_DEVICES  unset" in text


def test_devices_lists_cpu_then_each_gpu():
    assert _facts().devices() == [
        torch.device("cpu"),
        torch.device("cuda", 0),
        torch.device("cuda", 1),
    ]


def test_smoke_test_runs_where_tensors_can_live():
    assert smoke_test("cpu").startswith("cpu: 256x256 matmul ran, result on cpu")
    assert "result on meta" in smoke_test("meta", size=8)


def test_smoke_test_reports_a_missing_device_instead_of_raising():
    line = smoke_test(torch.device("cuda", torch.cuda.device_count()))
    assert "failed with" in line


def test_widget_offers_this_machines_devices_and_runs_a_test_on_click(capsys):
    panel = report_widget(
        _facts(cuda_build=None, cuda_available=False, device_count=0, cuda_devices=())
    )
    summary, controls, output = panel.children
    picker, button = controls.children
    assert list(picker.options) == ["cpu"]
    assert "CPU-only build" in summary.value
    button.click()
    # outside a kernel the Output widget cannot capture, so the line reaches stdout
    assert "cpu: 256x256 matmul ran" in capsys.readouterr().out + str(output.outputs)
