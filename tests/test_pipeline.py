"""The stages and the values between them: Positions -> RoPE.tables -> RotaryTables -> rotate -> kernels.

Each addressing mode of the tables equals the tensors computed directly; the kernel contract's
extensions (separate key tables, per-head tables, gradients into the tables) agree between the fused
CPU kernel and the pure-torch path; models compute their tables once per forward; a new table
producer needs nothing but tables (a 2-D axial RoPE in a few lines below).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import rotary
from helpers import assert_tables_match, numpy_cos_sin
from rotary import positions as P
from rotary.kernels import eager, ops
from rotary.kernels.contract import Rotation
from rotary.kernels.extension import load_cpu_extension
from rotary.models import Decoder, DecoderConfig
from rotary.tables import RotaryTables, cos_sin_table, expand_pairs

SRC = Path(rotary.__file__).parent


# ---- tables: each addressing mode equals the direct computation -------------------------------
@pytest.mark.parametrize(
    "positions, addressing",
    [
        (P.arange(6, offset=3), "shared"),
        (torch.tensor([[4, 0, 7], [1, 1, 2]]), "indexed"),
        (torch.tensor([5, 2, 9]), "indexed"),
        (P.arange(3, offset=2**40), "shared"),  # beyond the cache: rows computed for these tokens
        (torch.tensor([[2**33, 5]]), "per_token"),
    ],
)
@pytest.mark.parametrize("interleaved", [False, True])
def test_every_addressing_mode_equals_the_direct_tables(positions, addressing, interleaved):
    rope = rotary.RoPE(
        32,
        interleaved=interleaved,
        scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    )
    tables = rope.tables(positions)
    assert tables.addressing == addressing and tables.interleaved is interleaved
    ids = positions.ids if isinstance(positions, P.Positions) else positions
    # against NumPy's float64 cos and sin, not the library's own cos_sin_table
    want = numpy_cos_sin(ids, rope.inv_freq, attention_scaling=rope.attention_scaling, interleaved=interleaved)
    assert_tables_match(tables.gather(), want)


def test_tables_refuse_structures_that_cannot_be_applied():
    c = torch.ones(4, 8)
    with pytest.raises(ValueError, match="same shape"):
        RotaryTables(c, torch.ones(4, 6), False)
    with pytest.raises(ValueError, match="r=7 channels"):
        RotaryTables(torch.ones(4, 7), torch.ones(4, 7), False)
    with pytest.raises(TypeError, match="interleaved must be True or False"):
        RotaryTables(c, c, "false")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rows must be an int64"):
        RotaryTables(c, c, False, rows=torch.zeros(3))
    with pytest.raises(ValueError, match="table \\[N, r\\] indexed by row"):
        RotaryTables(c[None], c[None], False, rows=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="both k_cos and k_sin"):
        RotaryTables(c, c, False, k_cos=c)
    with pytest.raises(ValueError, match="head axis of 3"):
        RotaryTables(c, c, False, heads=3)


def test_cheap_default_check_catches_broken_tables():
    cos, sin = rotary.RoPE(64, interleaved=True).cos_sin(torch.arange(8))
    q = torch.randn(1, 4, 8, 64)
    with pytest.raises(ValueError, match="laid out for the interleaved"):
        rotary.apply_rotary(q, cos, sin)
    with pytest.raises(ValueError, match="fit neither pairing"):
        rotary.apply_rotary(q, cos[:, 0::2], sin[:, 0::2])  # half-width tables of the interleaved layout
    half_cos, half_sin = rotary.RoPE(64).cos_sin(torch.arange(8))
    with pytest.raises(ValueError, match="NaN or inf"):
        rotary.apply_rotary(q, half_cos.clone().fill_(float("nan")), half_sin)
    with pytest.raises(ValueError, match="all zeros"):
        rotary.apply_rotary(q, torch.zeros_like(half_cos), torch.zeros_like(half_sin))
    with pytest.raises(ValueError, match="NaN or inf"):
        rotary.check_tables(half_cos.clone().fill_(float("inf")), half_sin, interleaved=False)


# ---- the kernel contract ------------------------------------------------------------------------
def _both_paths(rotation: Rotation) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    fused = [torch.empty_like(x) for x in rotation.xs]
    ops.run(
        Rotation(
            rotation.xs,
            tuple(fused),
            rotation.cos,
            rotation.sin,
            rotation.positions,
            rotation.batch_rows,
            rotation.interleaved,
            rotation.conjugate,
        )
    )
    torch_outs = [torch.empty_like(x) for x in rotation.xs]
    eager.run_torch(
        Rotation(
            rotation.xs,
            tuple(torch_outs),
            rotation.cos,
            rotation.sin,
            rotation.positions,
            rotation.batch_rows,
            rotation.interleaved,
            rotation.conjugate,
        )
    )
    return fused, torch_outs


needs_kernel = pytest.mark.skipif(load_cpu_extension() is None, reason="the fused CPU kernel is not built here")


@needs_kernel
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_separate_key_tables_and_per_head_tables_fused_equals_torch(interleaved, dtype, gen):
    B, S, H, D, r = 2, 5, 3, 16, 12
    xs = tuple(torch.randn(B, S, H, D, generator=gen).to(dtype) for _ in range(2))
    tdt = torch.float64 if dtype == torch.float64 else torch.float32
    cq, sq = cos_sin_table(torch.arange(9), torch.rand(r // 2, generator=gen), interleaved=interleaved, dtype=tdt)
    ck, sk = cq * 0.5, sq * 2.0  # xPos-like: keys scaled differently
    pos = torch.randint(0, 9, (B, S), generator=gen)
    fused, ref = _both_paths(Rotation(xs, xs, (cq, ck), (sq, sk), pos, 0, interleaved))
    assert all(torch.equal(a, b) for a, b in zip(fused, ref))
    per_head = cos_sin_table(
        torch.arange(9)[:, None], torch.rand(H, 1, r // 2, generator=gen), interleaved=interleaved, dtype=tdt
    )
    assert per_head[0].shape == (9, H, r)
    fused, ref = _both_paths(Rotation(xs, xs, (per_head[0],) * 2, (per_head[1],) * 2, None, 0, interleaved, True))
    assert all(torch.equal(a, b) for a, b in zip(fused, ref))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("mode", ["shared", "indexed", "stacked", "per_head"])
def test_gradients_into_the_tables(interleaved, mode, gen):
    """gradcheck in float64 of x and the tables together, through rotate (fused kernel on CPU).

    Tables are laid out from per-pair values (as learnable frequencies make them): the kernels read one
    value per pair, so channel tables whose two halves differ are not rotations and have no gradient to match.
    Random tables are no rotations either: they are made with RotaryTables.unchecked (the constructor refuses them).
    """
    B, S, H, D, r = 2, 3, 2, 6, 4
    x = torch.randn(B, H, S, D, dtype=torch.float64, generator=gen, requires_grad=True)
    n = {"shared": S, "indexed": 5, "stacked": B * S, "per_head": S}[mode]
    shape = (n, H, r // 2) if mode == "per_head" else (n, r // 2)
    cos = torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True)
    sin = torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True)
    rows = torch.randint(0, 5, (B, S), generator=gen) if mode == "indexed" else None

    def layout(cos, sin):
        c, s = expand_pairs(cos, interleaved), expand_pairs(sin, interleaved)
        return (c.view(B, S, r), s.view(B, S, r)) if mode == "stacked" else (c, s)

    def f(x, cos, sin):
        c, s = layout(cos, sin)
        tables = RotaryTables.unchecked(c, s, interleaved, rows=rows, heads=H if mode == "per_head" else None)
        return rotary.rotate([x], tables)[0]

    assert torch.autograd.gradcheck(f, (x, cos, sin))

    def plain(x, cos, sin):  # the same rotation from gathered rows, in plain torch ops
        c, s = layout(cos, sin)
        if rows is not None:
            c, s = c[rows], s[rows]
        c, s = (c, s) if mode == "per_head" else (c.unsqueeze(-2), s.unsqueeze(-2))  # [.., S, H or 1, r]
        return eager.rotate_torch(x.transpose(1, 2), c, s, interleaved=interleaved, inplace=False).transpose(1, 2)

    g = torch.randn(B, H, S, D, dtype=torch.float64, generator=gen)
    fused = torch.autograd.grad(f(x, cos, sin), (x, cos, sin), g)
    want = torch.autograd.grad(plain(x, cos, sin), (x, cos, sin), g)
    for a, b in zip(fused, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_float64_inputs_get_float64_tables():
    rope = rotary.RoPE(64)
    q = torch.randn(1, 2, 8, 64, dtype=torch.float64)
    start = 2**20
    out = rope.rotate(q, offset=start)
    ref = rotary.reference.rotate_complex(q, torch.arange(start, start + 8), rope.inv_freq)
    assert float((out - ref).abs().max()) < 1e-12
    fp32 = rope.rotate(q.float(), offset=start).double()
    assert float((fp32 - ref).abs().max()) > 1e-9  # the fp32 tables are what they are


# ---- models: tables once per forward, scaling changed for evaluation ---------------------------
def test_decoder_computes_its_tables_once_per_forward(monkeypatch):
    model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_layers=3, num_heads=4)).eval()
    calls = []
    real = rotary.RoPE.tables
    monkeypatch.setattr(rotary.RoPE, "tables", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    ids = torch.randint(50, (2, 7))
    model(ids)
    assert len(calls) == 1
    calls.clear()
    model.generate(ids, 3)
    assert len(calls) == 3  # one prefill, two cached steps (the last token needs no forward)


@pytest.mark.parametrize(
    "encoding, scaling",
    [
        ("rope", {"rope_type": "linear", "factor": 4.0}),
        ("rope", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
        ("rope", {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 16}),
        ("rope", None),
        ("p_rope", {"rope_type": "proportional", "factor": 4.0, "partial_rotary_factor": 0.5}),
        ("p_rope", None),
    ],
)
def test_set_rope_scaling_equals_a_model_built_with_it(encoding, scaling):
    torch.manual_seed(0)
    config = dict(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, rope_base=500.0, position_encoding=encoding)
    trained = Decoder(DecoderConfig(**config)).eval()
    built = Decoder(DecoderConfig(**config, rope_scaling=scaling)).eval()
    built.load_state_dict(trained.state_dict())
    trained.set_rope_scaling(scaling)
    ids = torch.randint(50, (2, 40))
    assert torch.equal(trained(ids), built(ids))
    assert all(layer.attn.rope is trained.rope for layer in trained.layers)


def test_set_rope_scaling_refuses_what_the_constructor_refuses():
    """p-RoPE stays p-RoPE; a block the constructor refuses is refused here too, and the model is unchanged."""
    config = dict(vocab_size=50, hidden_size=32, num_layers=1, num_heads=4, rope_base=500.0)
    p_rope = Decoder(DecoderConfig(**config, position_encoding="p_rope"))
    p_rope.set_rope_scaling(None)
    assert p_rope.rope.freqs.rope_type == "proportional" and int((p_rope.rope.inv_freq == 0).sum()) == 3
    for encoding, block, match in [
        ("rope", {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, "rope_theta"),
        ("p_rope", {"rope_type": "linear", "factor": 2.0}, "is the 'proportional' rope_type"),
        ("rope", "linear", "must be a dict"),
    ]:
        model = Decoder(DecoderConfig(**config, position_encoding=encoding))
        before = model.rope
        with pytest.raises((ValueError, TypeError), match=match):
            model.set_rope_scaling(block)
        assert model.rope is before and model.config.rope_scaling is None


def test_set_rope_scaling_needs_a_rope():
    model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=4, position_encoding="alibi"))
    with pytest.raises(ValueError, match="has no rotary.RoPE to rescale"):
        model.set_rope_scaling({"rope_type": "linear", "factor": 2.0})


# ---- a new producer of tables: 2-D axial RoPE, on the fused kernel -----------------------------
class Axial2D(nn.Module):
    """Pairs [0, r/4) turn with y, [r/4, r/2) with x: inv_freq [2, r/2] with one axis per pair."""

    def __init__(self, head_dim: int, base: float = 100.0) -> None:
        super().__init__()
        half = rotary.frequencies(head_dim // 2, base=base).inv_freq  # [r/4] per axis
        zeros = torch.zeros_like(half)
        self.inv_freq = torch.stack((torch.cat((half, zeros)), torch.cat((zeros, half))))  # [2, r/2]

    def tables(self, positions, *, dtype=torch.float32):
        positions = P.from_ids(positions, axes=2) if not isinstance(positions, P.Positions) else positions
        cos, sin = cos_sin_table(positions.ids, self.inv_freq, dtype=dtype)
        return RotaryTables(cos, sin, interleaved=False)


@needs_kernel
def test_a_2d_axial_producer_needs_only_tables(monkeypatch, gen):
    monkeypatch.setattr(eager, "run_torch", lambda *a: pytest.fail("took the pure-torch path"))
    monkeypatch.setattr(ops, "run_torch", lambda *a: pytest.fail("took the pure-torch path"))
    axial = Axial2D(32)
    grid = P.grid(4, 5)  # 20 tokens, (y, x)
    q, k = torch.randn(2, 3, 20, 32, generator=gen), torch.randn(2, 3, 20, 32, generator=gen)
    qr, kr = rotary.rotate([q, k], axial.tables(grid), kinds=("q", "k"))
    # relative per axis: shifting the whole grid by (dy, dx) keeps every score
    shifted = P.from_ids(grid.ids + torch.tensor([7, 3]), axes=2)
    qs, ks = rotary.rotate([q, k], axial.tables(shifted), kinds=("q", "k"))
    torch.testing.assert_close(qr @ kr.transpose(-1, -2), qs @ ks.transpose(-1, -2), rtol=1e-5, atol=1e-4)
    # and it is rotation by y on the first pairs, by x on the others (a float64 oracle)
    y, x = grid.ids[:, 0], grid.ids[:, 1]
    half = axial.inv_freq[0, :8]
    ref = torch.cat(
        (
            rotary.reference.rotate_complex(q[..., [*range(8), *range(16, 24)]].double(), y, half),
            rotary.reference.rotate_complex(q[..., [*range(8, 16), *range(24, 32)]].double(), x, half),
        ),
        dim=-1,
    )
    got = qr[..., [*range(8), *range(16, 24), *range(8, 16), *range(24, 32)]].double()
    assert float((got - ref).abs().max()) < 1e-5


# ---- the package's shape -------------------------------------------------------------------------
def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names) for every import of one file (deferred ones inside functions included),
    relative ones resolved, and ``(module, [name])`` for every ``alias._name`` read through a module alias."""
    tree = ast.parse(path.read_text())
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    out = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:  # `from .. import positions as P`: P is a module
                aliases[a.asname or a.name] = ""
        elif isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((module, [a.name for a in node.names]))
            for a in node.names:
                if aliases.get(a.asname or a.name) == "":
                    aliases[a.asname or a.name] = f"{module}.{a.name}"
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            module = aliases.get(node.value.id)
            if module and module.startswith("rotary"):
                out.append((module, [node.attr]))
    return out


def test_no_import_cycle_and_no_private_cross_module_imports():
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for module, names in _imports(path):
            for target in [module, *(f"{module}.{n}" for n in names)]:
                if target in files and target != name:
                    deps.add(target)
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            assert not (module.startswith("rotary") and private), f"{name} imports private {private} from {module}"
        graph[name] = deps
    # a package __init__ importing its own submodules is not a cycle between stages
    for name in graph:
        graph[name] = {d for d in graph[name] if not (files[name].name == "__init__.py" and d.startswith(name + "."))}
        graph[name] = {d for d in graph[name] if files[d].name != "__init__.py" or not name.startswith(d + ".")}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in graph[node]:
            if state.get(dep) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(dep) :], dep]))
            if dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])


def test_import_each_alone_sees_a_failing_import_and_a_thread_left_running(tmp_path, monkeypatch):
    from helpers import import_each_alone

    (tmp_path / "breaks_on_import.py").write_text("import rotary.no_such_module\n")
    (tmp_path / "leaves_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
    )
    (tmp_path / "needs_rotary_first.py").write_text("import sys\nassert 'rotary' not in sys.modules\nimport rotary\n")
    # a package whose __init__ imports one of its modules: that module needs no child of its own when the
    # package's succeeds (its child would import the package first, the same way), and has one otherwise
    for package in ("fine", "threads"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("from . import inner\n")
        (tmp_path / package / "alone.py").write_text("import sys\nassert 'rotary' not in sys.modules\n")
    imports = tmp_path / "imports.txt"  # a line per import of fine.inner: per child that imported it
    (tmp_path / "fine" / "inner.py").write_text(f"with open({str(imports)!r}, 'a') as f:\n    f.write('x\\n')\n")
    (tmp_path / "threads" / "inner.py").write_text((tmp_path / "leaves_a_thread.py").read_text())
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    names = ["breaks_on_import", "leaves_a_thread", "needs_rotary_first", "json"]
    names += [f"{package}{suffix}" for package in ("fine", "threads") for suffix in ("", ".inner", ".alone")]
    failed = import_each_alone(names, timeout=120)
    assert sorted(failed) == ["breaks_on_import", "leaves_a_thread", "threads", "threads.alone", "threads.inner"], (
        failed
    )
    assert "No module named 'rotary.no_such_module'" in failed["breaks_on_import"]
    for name in ("leaves_a_thread", "threads", "threads.inner", "threads.alone"):
        assert f"importing {name} left threads" in failed[name], failed[name]
    assert imports.read_text() == "x\nx\n"  # the children of fine and fine.alone; fine.inner is fine's


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    """Each module in a process of its own that has imported torch (and triton) and nothing of rotary (forked
    children of one interpreter: :func:`helpers.import_each_alone`)."""
    from helpers import import_each_alone

    modules = sorted(_module_name(p) for p in SRC.rglob("*.py") if p.name != "__main__.py")
    assert len(modules) > 100
    failed = import_each_alone(modules)
    assert not failed, failed
