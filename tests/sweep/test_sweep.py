"""rotary sweep: each scaling's model is the one transformers builds from the edited config, in 4.x and
5.x configs of Llama, Qwen3, Phi-3 (LongRoPE) and Gemma 3; the experiment's own perplexities on an
exported model; passkey intervals; resuming; bad input."""

import json
import math

import pytest
import torch

from rotary.errors import InputError
from rotary.models import Decoder, DecoderConfig
from rotary.tools.cli import main
from rotary.tools.experiments.data import windows
from rotary.tools.experiments.evaluate import sliding_losses, summarise, token_losses
from rotary.tools.experiments.stats import wilson
from rotary.tools.sweep.checkpoint import check_tables, open_checkpoint
from rotary.tools.sweep.export import byte_tokenizer, hf_config_of, to_hf_state_dict
from rotary.tools.sweep.measure import perplexity

transformers = pytest.importorskip("transformers")

TINY = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=32,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
LONG, SHORT = [1.0 + 0.25 * i for i in range(8)], [1.0 + 0.05 * i for i in range(8)]

#: name -> (config.json, the RoPE block of each scaling at factor 2 as the test writes it by hand)
FAMILIES = {
    "llama-4.x": dict(model_type="llama", rope_theta=500000.0, **TINY),
    "llama-5.x": dict(model_type="llama", rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, **TINY),
    "llama-3.1": dict(
        model_type="llama",
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 4.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 32,
        },
        **{**TINY, "max_position_embeddings": 128},
    ),
    "qwen3": dict(model_type="qwen3", rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **TINY),
    "phi3": dict(
        model_type="phi3",
        rope_theta=10000.0,
        original_max_position_embeddings=32,
        rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
        **{**TINY, "max_position_embeddings": 128},
    ),
    "gemma3": dict(
        model_type="gemma3_text",
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        },
        **TINY,
    ),
}
BLOCKS = {
    "none": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "ntk": {"rope_type": "default"},  # at rope_theta x 2 ** (d / (d - 2)): edited_by_hand raises it
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
    "llama3": {
        "rope_type": "llama3",
        "factor": 2.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    "longrope": {
        "rope_type": "longrope",
        "factor": 2.0,
        "short_factor": SHORT,
        "long_factor": LONG,
        "original_max_position_embeddings": 32,
    },
}


def edited_by_hand(name: str, scaling: str) -> dict:
    """The oracle: the config a user would write for ``scaling`` at factor 2, key by key."""
    c = json.loads(json.dumps(FAMILIES[name]))
    block = BLOCKS[scaling]
    if name == "llama-3.1":  # the origin is the original 32, not max_position_embeddings (128)
        if scaling == "dynamic":
            c["max_position_embeddings"] = 32  # dynamic NTK measures from here
        if scaling == "llama3":
            block = {**block, "low_freq_factor": 2.0, "high_freq_factor": 8.0}  # the model's own bands
    raise_base = 2.0 ** (16 / 14) if scaling == "ntk" else 1.0  # NTK-aware: d = head_dim = 16, every channel rotated
    if name == "gemma3":
        c["rope_parameters"]["full_attention"] = {**block, "rope_theta": 1e6 * raise_base}
    elif "rope_parameters" in c:
        c["rope_parameters"] = {**block, "rope_theta": c["rope_parameters"]["rope_theta"] * raise_base}
    else:
        c["rope_theta"] *= raise_base
        c["rope_scaling"] = None if scaling in ("none", "ntk") else block
    return c


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    from pydoc_data.topics import topics

    root = tmp_path_factory.mktemp("texts")
    for i, key in enumerate(["assignment", "class", "for"]):
        (root / f"doc{i}.txt").write_text(topics[key][:1200], encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    tokenizer = byte_tokenizer()
    out = {}
    for name, config in FAMILIES.items():
        torch.manual_seed(0)
        c = dict(config)
        model_type = c.pop("model_type")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **c))
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        raw = json.loads((root / name / "config.json").read_text())
        for key in ("rope_scaling", "rope_parameters", "rope_theta", "original_max_position_embeddings"):
            raw.pop(key, None)  # save_pretrained writes the 5.x form: put back the form this case is about
        raw.update(
            {
                k: v
                for k, v in config.items()
                if k in ("rope_scaling", "rope_parameters", "rope_theta", "original_max_position_embeddings")
            }
        )
        (root / name / "config.json").write_text(json.dumps(raw))
        out[name] = root / name
    return out


def first_l_loss(model, documents, length):
    """Token-weighted mean loss of the first ``length`` tokens of each document, by transformers' own loss."""
    with torch.no_grad():
        losses = [float(model(input_ids=d[None, :length], labels=d[None, :length]).loss) for d in documents]
    return sum(losses) / len(losses)  # every document scores length - 1 tokens


@pytest.fixture
def no_figures(monkeypatch):
    """Sweeps that draw no figure: matplotlib is "not installed" for them (the report says so). The figures are
    drawn by the passkey test, which checks them."""
    from rotary.tools.sweep import run

    def no_matplotlib(*args):
        raise ImportError("No module named 'matplotlib'", name="matplotlib")

    monkeypatch.setattr(run, "_figures", no_matplotlib)


def sweep(argv, capsys):
    status = main(["sweep", *argv])
    captured = capsys.readouterr()
    return status, captured


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_scaling_is_the_model_transformers_builds_from_the_edited_config_and_the_patch_run(
    name, checkpoints, texts, tmp_path, capsys, no_figures
):
    lengths = [32, 64] if name == "phi3" else [64]  # Phi-3: LongRoPE's short factors at 32, long ones at 64
    args = [str(checkpoints[name]), "--lengths", ",".join(map(str, lengths)), "--no-passkey", "--data", str(texts)]
    assert sweep([*args, "-o", str(tmp_path / "hf")], capsys)[0] == 0
    assert sweep([*args, "--patch", "-o", str(tmp_path / "patched")], capsys)[0] == 0
    ours = json.loads((tmp_path / "hf" / "sweep.json").read_text())
    patched = json.loads((tmp_path / "patched" / "sweep.json").read_text())
    expected_scalings = (
        ["none", "ntk", "longrope"] if name == "phi3" else ["none", "linear", "ntk", "dynamic", "yarn", "llama3"]
    )
    assert ours["settings"]["scalings"] == expected_scalings
    documents = [torch.tensor(list(p.read_bytes())) for p in sorted(texts.iterdir())]
    seen = set()
    for scaling in expected_scalings:
        config = edited_by_hand(name, scaling)
        model_type = config.pop("model_type")
        hf_config = transformers.AutoConfig.for_model(model_type, **config)
        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoints[name], config=hf_config).eval()
        length = 64
        expected = math.exp(first_l_loss(model, documents, length))
        row = next(r for r in ours["perplexity"] if r == r | {"scaling": scaling, "length": length, "mode": "first"})
        assert row["perplexity"] == pytest.approx(expected, rel=1e-5), scaling
        for r in ours["perplexity"]:
            twin = next(p for p in patched["perplexity"] if all(p[k] == r[k] for k in ("scaling", "length", "mode")))
            assert twin["perplexity"] == pytest.approx(r["perplexity"], rel=1e-5)
        seen.add(round(row["perplexity"], 6))
    assert "Figures not drawn: matplotlib is not installed" in (tmp_path / "hf" / "report.md").read_text()
    assert len(seen) == len(expected_scalings)  # every scaling is a different model at factor 2


def test_a_model_built_without_the_scaling_fails_the_table_check(checkpoints):
    ck = open_checkpoint(str(checkpoints["llama-5.x"]))
    plain = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["llama-5.x"]).eval()
    config = edited_by_hand("llama-5.x", "yarn")
    with pytest.raises(InputError, match="rotates differently from rotary's tables"):
        check_tables(plain, ck, config, 64)


def test_exported_experiment_model_gives_the_experiments_own_perplexities_in_the_same_windows():
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(hidden_size=32, num_layers=2, num_heads=2, max_position=512)).eval()
    config = hf_config_of(model, 64)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).eval()
    hf.load_state_dict(to_hf_state_dict(model), strict=False)
    from pydoc_data.topics import topics

    text = torch.tensor(list(topics["class"].encode()[:1024]), dtype=torch.int64)
    for length in (64, 128, 256, 512):  # 1L .. 8L
        wins = windows(text, length)
        ours = perplexity(hf, list(wins), length, "first", rows=4).loss
        theirs = summarise(token_losses(model, wins))["loss"]
        assert math.exp(ours) == pytest.approx(math.exp(theirs), rel=1e-4)
        stride = length // 4
        count = min(6, (text.numel() - length) // stride + 1)
        ours = perplexity(hf, [text], length, "sliding", stride=stride, max_windows=6).loss
        starts = tuple(length - stride + k * stride for k in range(count))
        theirs = float(sliding_losses(model, text, length, stride, starts).double().mean())
        assert math.exp(ours) == pytest.approx(math.exp(theirs), rel=1e-4)


def test_passkey_rows_intervals_report_and_resume(checkpoints, texts, tmp_path, capsys, monkeypatch):
    long_text = tmp_path / "long.txt"
    long_text.write_text((texts / "doc0.txt").read_text() * 3)
    args = [
        str(checkpoints["llama-5.x"]),
        "--lengths",
        "256,512",
        "--scalings",
        "none,yarn",
        "--trials",
        "1",
        "--depths",
        "0,1",
        "--data",
        str(long_text),
        "--documents",
        "1",
        "-o",
        str(tmp_path / "out"),
    ]
    status, captured = sweep(args, capsys)
    assert status == 0 and "[4/4] yarn" in captured.err and "ETA" in captured.err
    state = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert len(state["passkey"]) == 2 * 2 * 2
    for r in state["passkey"]:
        assert (r["low"], r["high"]) == pytest.approx(wilson(r["correct"], r["trials"]))
    assert set(state["summary"]) == {"none", "yarn"}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Passkey retrieval" in report and "longest passing" in report and "figures/perplexity.png" in report
    assert (tmp_path / "out" / "figures" / "passkey.png").is_file()
    # a sweep stopped after three measurements resumes with the fourth, to the same numbers
    cut = dict(state, done=state["done"][:3], status="running")
    cut["perplexity"] = [r for r in state["perplexity"] if not (r["scaling"] == "yarn" and r["length"] == 512)]
    cut["passkey"] = [r for r in state["passkey"] if not (r["scaling"] == "yarn" and r["length"] == 512)]
    (tmp_path / "out" / "sweep.json").write_text(json.dumps(cut))
    from rotary.tools.sweep import run

    # the resumed sweep ends with the same rows (checked below), from which the figures were drawn: kept as they are
    monkeypatch.setattr(run, "_figures", lambda state, directory: ["figures/perplexity.png", "figures/passkey.png"])
    status, captured = sweep(args, capsys)
    assert status == 0 and "3 of 4 measurements already there" in captured.err
    again = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert again["perplexity"] == state["perplexity"] and again["passkey"] == state["passkey"]
    assert len((tmp_path / "out" / "perplexity.csv").read_text().splitlines()) == 1 + 8
    # other settings into the same directory are refused, and leave it as it was
    status, captured = sweep([*args, "--trials", "2"], capsys)
    assert status == 2 and "holds a sweep of other settings" in captured.err
    assert json.loads((tmp_path / "out" / "sweep.json").read_text()) == again


def test_bad_input_exits_2_with_one_line_and_writes_nothing(checkpoints, texts, tmp_path, capsys):
    nope = tmp_path / "nope"
    c = {k: v for k, v in TINY.items()}
    transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model("smollm3", no_rope_layers=[0, 0], **c)
    ).save_pretrained(nope)
    short = tmp_path / "short.txt"
    short.write_text("too short")
    (tmp_path / "empty").mkdir()
    llama = str(checkpoints["llama-5.x"])
    capsys.readouterr()  # what saving the model printed (transformers' progress bar, unless a sweep silenced it)
    cases = {
        "no config.json": [str(tmp_path / "empty")],
        "no layer of this smollm3 applies RoPE (no_rope_layers is 0 for layers 0-1)": [str(nope)],
        "unknown scaling 'pi'": [llama, "--scalings", "none,pi"],
        "does not admit it (LongRoPE": [llama, "--scalings", "longrope"],
        "does not admit it (transformers' phi3 config refuses it": [str(checkpoints["phi3"]), "--scalings", "yarn"],
        "GiB free": [llama, "--lengths", str(2**22)],
        "shorter than the longest length 64": [llama, "--lengths", "64", "--data", str(short)],
    }
    for i, (message, argv) in enumerate(cases.items()):
        out = tmp_path / f"out{i}"
        status, captured = sweep(
            [*argv, "--data", str(texts), "-o", str(out)] if "--data" not in argv else [*argv, "-o", str(out)], capsys
        )
        assert status == 2, message
        assert captured.err.count("\n") == 1 and message in captured.err, captured.err
        assert not out.exists()


def test_sliding_window_attention_is_reported_and_switched_off_on_request(texts, tmp_path, capsys, no_figures):
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("mistral", sliding_window=16, **TINY)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "mistral")
    byte_tokenizer().save_pretrained(tmp_path / "mistral")
    args = [str(tmp_path / "mistral"), "--lengths", "64", "--scalings", "none", "--no-passkey", "--data", str(texts)]
    status, captured = sweep([*args, "-o", str(tmp_path / "windowed")], capsys)
    assert status == 0 and "attends within 16 tokens (sliding window)" in captured.err
    assert "Sliding-window attention: 16 tokens." in (tmp_path / "windowed" / "report.md").read_text()
    status, captured = sweep([*args, "--full-attention", "-o", str(tmp_path / "full")], capsys)
    assert status == 0 and "switched off" in captured.err
    windowed, full = (
        json.loads((tmp_path / d / "sweep.json").read_text())["perplexity"][0] for d in ("windowed", "full")
    )
    documents = [torch.tensor(list(p.read_bytes())) for p in sorted(texts.iterdir())]
    for row, window in ((windowed, 16), (full, None)):
        oracle = transformers.AutoConfig.for_model("mistral", sliding_window=window, **TINY)
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "mistral", config=oracle).eval()
        assert row["perplexity"] == pytest.approx(math.exp(first_l_loss(model, documents, 64)), rel=1e-5)
    # a random model's perplexity is near the vocabulary size either way: the window moves it by 4e-4,
    # forty times the tolerance each one met against its oracle
    assert abs(windowed["perplexity"] - full["perplexity"]) > 1e-4 * full["perplexity"]


def test_longest_passing_length_is_where_accuracy_stops_staying_at_or_above_80_percent():
    from rotary.tools.sweep.run import longest_passing

    def rows(scaling, *counts):  # (length, correct, trials) summed over two depths
        return [
            {"scaling": scaling, "length": length, "depth": d, "correct": c // 2 + (c % 2) * (1 - d), "trials": t // 2}
            for length, c, t in counts
            for d in (0, 1)
        ]

    data = rows("yarn", (256, 10, 10), (512, 8, 10), (1024, 6, 10), (2048, 10, 10)) + rows("none", (256, 7, 10))
    assert longest_passing(data, "yarn") == 512  # 2048 passes again, but accuracy did not stay up to it
    assert longest_passing(data, "none") is None
