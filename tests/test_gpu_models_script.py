"""benchmarks/gpu_models.py without a GPU: variants, bad arguments, the markdown report; a CPU smoke run (slow)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_models():
    spec = importlib.util.spec_from_file_location("gpu_models", ROOT / "benchmarks" / "gpu_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_models"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_models", None)


def test_thunder_and_inductor_cuda_graphs_are_refused_in_one_process(gpu_models, capsys, monkeypatch):
    """Both CUDA-graph systems in one process crashed every case on the H100 (7864f7b): refused before any work."""
    monkeypatch.setattr(gpu_models, "run_here", lambda *a, **k: pytest.fail("started work"))
    assert gpu_models.main(["--model", "phi-2", "--variants", "guarded+cudagraph,inductor-ro"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "guarded+cudagraph and inductor-ro cannot run in one process" in err[0], err


def test_parse_variants(gpu_models):
    assert gpu_models.parse_variants("eager,guarded+cudagraph inductor-ro") == (
        "eager",
        "guarded+cudagraph",
        "inductor-ro",
    )
    assert gpu_models.parse_variants("all") == tuple(gpu_models.VARIANT_BUILDS)
    assert set(gpu_models.DEFAULT_VARIANTS) == {
        "eager",
        "thunder",
        "guarded",
        "guarded+cudagraph",
        "inductor",
    }
    with pytest.raises(ValueError, match="unknown variant 'graphs'; allowed: eager, thunder"):
        gpu_models.parse_variants("eager,graphs")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model", "phi-2", "--variants", "eager,turbo"], "--variants: unknown variant 'turbo'"),
        (["--variants", "eager"], "name a model"),
        (["--model", "phi-2", "--rounds", "0"], "--rounds must be >= 1"),
        (["--model", "phi-2", "--time-budget", "-5"], "--time-budget must be > 0"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(gpu_models, capsys, argv, message):
    assert gpu_models.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_models.py: ") and message in err[0]


def _variant(median: float, **extra) -> dict:
    stats = {"median_ms": median, "q1_ms": median, "q3_ms": median, "iqr_ms": 0.0, "min_ms": median, "max_ms": median}
    return {"first_call_s": 1.0, **stats, "rounds": 3, **extra}


def test_markdown_names_the_fastest_and_what_was_not_timed(gpu_models):
    doc = {
        "device": "NVIDIA H100",
        "versions": {"torch": "2.11", "thunder": "0.2.6"},
        "settings": {"layers": 2, "batch": 1, "tokens": 512, "dtype": "bfloat16", "rounds": 20},
        "models": [
            {
                "model": "Mistral-7B-v0.1",
                "step": "train",
                "variants": {
                    "eager": _variant(18.0),
                    "thunder": _variant(60.0),
                    "guarded": _variant(16.0, output_equal_thunder=True, grads_equal_thunder=True),
                    "inductor": _variant(12.0, cold_first_call_s=80.0),
                    "inductor-ro": {"cut": "compile cut by the time budget after 50 s"},
                },
            },
            {"model": "phi-2", "step": "decode", "error": "not run: time budget spent"},
        ],
    }
    text = gpu_models.markdown(doc)
    assert text.startswith("NVIDIA H100 (torch 2.11, thunder 0.2.6); 2 layers, batch 1, 512 tokens, bfloat16")
    assert "| Mistral-7B-v0.1 | train | guarded | 1.0 | 16.000 |" in text and "out True, grads True" in text
    assert "| inductor | 80.0 cold, 1.0 cached | 12.000 |" in text
    assert "| inductor-ro | - | compile cut by the time budget after 50 s |" in text
    assert "| phi-2 | decode | - | - | not run: time budget spent |" in text
    assert (
        "Mistral-7B-v0.1 train: fastest is inductor at 12.000 ms, 1.33x faster than the next, guarded (16.000 ms), "
        "1.50x faster than eager." in text
    )


@pytest.mark.slow
def test_cpu_smoke_run_parallel(tmp_path):
    """Two cases compiled in parallel processes on CPU (tiny widths), then timed one at a time; JSON and markdown."""
    pytest.importorskip("litgpt")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_models.py"), "--device", "cpu", "--model", "phi-2"]
    cmd += ["--decode", "Llama-2-7b-hf", "--variants", "eager,thunder,guarded,inductor", "--rounds", "2"]
    cmd += ["--warmup", "0", "--tokens", "16", "--jobs", "2", "--out", str(tmp_path), "--tag", "smoke"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads((tmp_path / "smoke.json").read_text())
    assert [(m["model"], m["step"]) for m in doc["models"]] == [("phi-2", "train"), ("Llama-2-7b-hf", "decode")]
    for m in doc["models"]:
        assert list(m["variants"]) == ["eager", "thunder", "guarded", "inductor"]
        assert all(v["rounds"] == 2 and v["first_call_s"] >= 0 for v in m["variants"].values())
        assert m["variants"]["guarded"]["output_equal_thunder"] is True
        assert "timed_while_compiling" not in m
    assert doc["models"][0]["variants"]["guarded"]["grads_equal_thunder"] is True
    assert "fastest is" in (tmp_path / "smoke.md").read_text()
