"""``rotary plot {decay,frequencies,scaling,scores,positions,axial,learnable}``: figures as PNG + SVG."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from rotary import analysis
from rotary.frequencies import frequencies
from rotary.rope import RoPE
from rotary.rope_types import ROPE_TYPES

from ...errors import InputError
from .argument_types import count, head_dim_count, length_count, positive_float, seed, seq_len_count
from .configuration import (
    FLAG_DEFAULTS,
    add_config_arguments,
    check_heads_need_mixed,
    config_label,
    configurations,
    every_layer_type,
    flag_as_given,
    layer_type_suffix,
)
from .output import add_output_argument, output_directory, output_stem
from .printing import print_json
from .vectors import load_vector

__all__ = [
    "register",
    "make_decay",
    "make_frequencies",
    "make_scaling",
    "make_scores",
    "make_positions",
    "make_axial",
    "make_learnable",
    "make_variants",
]


def _announce(args: argparse.Namespace, files: list[Path], numbers: dict[str, Any]) -> int:
    if args.json:
        print_json({"files": [str(f) for f in files], **numbers})
    else:
        for f in files:
            print(f"wrote {f}")
    return 0


# the five figures: each returns (files, numbers) -------------------------------------------------
def make_decay(out: Path, head_dim: int, base: float, max_distance: int, measured: bool, samples: int = 256):
    from rotary.tools import plots

    distances = list(range(max_distance + 1))
    bound = analysis.decay_bound(head_dim, base, distances)
    numbers: dict[str, Any] = {"head_dim": head_dim, "base": base, "distances": distances, "bound": bound.tolist()}
    extra = None
    if measured:
        rope = RoPE(head_dim, base=base, max_position=max_distance + 1)
        rand = analysis.measured_decay(rope, distances, kind="random", samples=samples)
        ones = analysis.measured_decay(rope, distances, kind="ones")
        extra = {f"random q, k (mean of {samples})": rand, "q = k = all ones": ones}
        numbers["measured_random"] = rand.tolist()
        numbers["measured_ones"] = ones.tolist()
    fig = plots.plot_decay(distances, bound, extra, title=f"Long-range decay of RoPE (d = {head_dim}, base {base:g})")
    return plots.save(fig, out), numbers


def make_frequencies(out: Path, ropes: dict[str, RoPE], context: int | None):
    from rotary.tools import plots

    series = {label: analysis.scaling_profile(r.freqs).wavelength for label, r in ropes.items()}
    fig = plots.plot_frequencies(series, context=context)
    return plots.save(fig, out), {"wavelengths": series}


def make_scaling(out: Path, rope: RoPE, context: int, seq_len: int | None = None, note: str = ""):
    from rotary.tools import plots

    f = rope.freqs
    if seq_len is not None:
        f = frequencies(f.head_dim, base=f.base, rotary_dim=f.rotary_dim, scaling=dict(f.scaling), seq_len=seq_len)
    profile = analysis.scaling_profile(f)
    trained = f.scaling.get("original_max_position_embeddings") or f.scaling.get("max_position_embeddings") or context
    fig = plots.plot_scaling(profile, rope_type=f.rope_type, context=trained, note=note)
    numbers = {
        "rope_type": f.rope_type,
        "scaling": dict(f.scaling),
        "attention_scaling": f.attention_scaling,
        "seq_len": seq_len,
        "full_factor": profile.full_factor,
        "kind": profile.kind,
        "factor": profile.factor,
        "ramp": profile.ramp,
        "wavelength": profile.wavelength,
        "original_wavelength": profile.original_wavelength,
        "interpolated_pairs": profile.pairs_of("interpolated"),
        "blended_pairs": profile.pairs_of("blended"),
        "extrapolated_pairs": profile.pairs_of("extrapolated"),
    }
    return plots.save(fig, out), numbers


def make_scores(out: Path, rope: RoPE, seq_len: int, q: str | None = None, k: str | None = None, seed: int = 0):
    from rotary.tools import plots

    d = rope.head_dim
    g = torch.Generator().manual_seed(seed)
    qv = load_vector(q, d) if q else torch.randn(d, generator=g, dtype=torch.float64)
    kv = load_vector(k, d) if k else torch.randn(d, generator=g, dtype=torch.float64)
    scores = analysis.score_matrix(rope, qv, kv, seq_len)
    if not bool(torch.isfinite(scores).all()):
        raise InputError(
            f"the logits <R_m q, R_n k> overflow float64 (largest |q| entry {qv.abs().max().item():g}, |k| entry "
            f"{kv.abs().max().item():g}); scale q and k down"
        )
    source = "given" if q or k else f"random (seed {seed})"
    fig = plots.plot_scores(scores, title=f"Attention logits ⟨R_m q, R_n k⟩ of rotated q, k ({source})")
    return plots.save(fig, out), {"seq_len": seq_len, "logit_by_distance": scores[:, 0].tolist()}


def make_positions(out: Path, rope: RoPE, seq_len: int):
    from rotary.tools import plots

    coords, explained = analysis.position_pca(rope, seq_len)
    fig = plots.plot_positions(coords, explained)
    return plots.save(fig, out), {"seq_len": seq_len, "explained_variance_ratio": explained.tolist()}


# vision variants and learnable frequencies (docs/variants.md) -------------------------------------
#: the axial presets drawn when none is named: one per distinct convention of 2-D and 3-D models
AXIAL_FIGURE_PRESETS = ("pixtral", "torchtune", "dinov3", "flux")


def make_axial(
    out: Path, presets: list[str], head_dim: int | None, mixed: bool, heads: int, extent: int, random: bool, seed: int
):
    """Score against (Δh, Δw) for axial presets and/or the heads of a RoPE-Mixed."""
    import math

    from rotary.tools import plots
    from rotary.variants import AxialRoPE, RoPEMixed, relative_scores

    g = torch.Generator().manual_seed(seed)
    content = f"random q, k (seed {seed})" if random else "q = k = all ones"

    def vectors(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        if random:
            return torch.randn(shape, generator=g, dtype=torch.float64), torch.randn(
                shape, generator=g, dtype=torch.float64
            )
        return torch.ones(shape, dtype=torch.float64), torch.ones(shape, dtype=torch.float64)

    maps: dict[str, torch.Tensor] = {}
    for name in presets:
        rope = AxialRoPE.preset(name, head_dim)
        q, k = vectors((rope.head_dim,))
        maps[f"{name} (d = {rope.head_dim})"] = relative_scores(rope, q, k, extent)
    if mixed:
        rope = RoPEMixed(head_dim or 64, heads, generator=g)
        q, k = vectors((heads, rope.head_dim))
        per_head = relative_scores(rope, q, k, extent)
        freq = rope.inv_freq.detach()
        for h in range(heads):
            phi = math.degrees(math.atan2(float(freq[h, 0, 0]), float(freq[h, 1, 0]))) % 360
            maps[f"RoPE-Mixed head {h} (φ = {phi:.0f}°)"] = per_head[h]
    what = " and ".join(filter(None, ["axial presets" if presets else "", "RoPE-Mixed heads" if mixed else ""]))
    fig = plots.plot_axial_scores(maps, extent=extent, title=f"Score against the offset (Δh, Δw): {what}, {content}")
    return plots.save(fig, out), {
        "extent": extent,
        "content": content,
        "scores": {k: v.tolist() for k, v in maps.items()},
    }


def make_learnable(out: Path, steps: int, seed: int = 0):
    """Learnable frequencies recover a teacher's: a RoPE(16, base 100) student fits the scores of a teacher
    at 0.8 times its frequencies.
    """
    from rotary.tools import plots

    g = torch.Generator().manual_seed(seed)
    teacher = RoPE(16, base=100.0, scaling={"rope_type": "linear", "factor": 1.25})
    student = RoPE(16, base=100.0, learnable_frequencies=True)
    opt = torch.optim.Adam(student.parameters(), lr=0.02)
    losses = []
    for _ in range(steps):
        q, k = torch.randn(4, 2, 16, 16, generator=g), torch.randn(4, 2, 16, 16, generator=g)
        with torch.no_grad():
            tq, tk = teacher(q, k)
        sq, sk = student(q, k)
        loss = ((sq @ sk.transpose(-1, -2) - tq @ tk.transpose(-1, -2)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    series = {
        "configured θ_i (base 100)": analysis.scaling_profile(student.original_freqs).wavelength,
        "teacher: θ_i / 1.25": analysis.scaling_profile(teacher.freqs).wavelength,
        f"learned θ_i·exp(α_i), {steps} steps": (2 * torch.pi / student.learned_inv_freq.double()).tolist(),
    }
    title = "Learnable frequencies fit a teacher's attention scores (d = 16, Adam, lr 0.02)"
    fig = plots.plot_learned_frequencies(series, losses, title=title)
    numbers = {
        "steps": steps,
        "losses": losses,
        "wavelengths": series,
        "learned_factor": student.log_frequency_scale.exp().tolist(),
    }
    return plots.save(fig, out), numbers


def make_variants(out_dir: Path):
    """The figures of docs/variants.md: M-RoPE's slots, xPos's decay, p-RoPE and Llama 4's NoPE temperature."""
    from rotary.tools import plots
    from rotary.variants import MRoPE, XPos

    files: list[Path] = []
    layouts, spans = {}, {}
    for title, section, interleaved in (
        ("Qwen2-VL / Qwen2.5-VL: chunked, mrope_section [16, 24, 24]", [16, 24, 24], False),
        ("Qwen3-VL: interleaved, mrope_section [24, 20, 20]", [24, 20, 20], True),
    ):
        layout = analysis.mrope_layout(MRoPE(128, mrope_section=section, mrope_interleaved=interleaved, base=1e6))
        layouts[title] = (layout.axes, layout.wavelength)
        spans[title] = layout.span
    files += plots.save(plots.plot_mrope(layouts), out_dir / "mrope")

    xpos = XPos(64)
    distances = list(range(4097))
    exponent = torch.tensor(distances, dtype=torch.float64) / xpos.scale_base
    factors = {f"pair {i}: ζ = {float(xpos.zeta[i]):.4f}": (xpos.zeta[i] ** exponent).tolist() for i in (0, 8, 16, 31)}
    scores = {
        f"xPos (γ = {xpos.scale_base:g})": analysis.xpos_scores(xpos, distances).tolist(),
        "RoPE": analysis.measured_decay(RoPE(64), distances, kind="ones").tolist(),
    }
    files += plots.save(plots.plot_xpos(distances, factors, scores, scale_base=xpos.scale_base), out_dir / "xpos")

    wavelengths = {
        "RoPE (p = 1)": analysis.p_rope_wavelengths(128, 1.0),
        "p-RoPE p = 0.5": analysis.p_rope_wavelengths(128, 0.5),
        "p-RoPE p = 0.25 (Gemma 4)": analysis.p_rope_wavelengths(128, 0.25),
    }
    positions = sorted(set(range(0, 65537, 64)) | {8190, 8191})
    temperature = analysis.nope_temperature_curve(positions).tolist()
    fig = plots.plot_nope_layers(wavelengths, positions, temperature, floor_scale=8192, attn_scale=0.1)
    files += plots.save(fig, out_dir / "nope_layers")
    numbers = {
        "mrope_spans": spans,
        "xpos_max_distance": xpos.max_distance,
        "nope_temperature_at_8191": temperature[positions.index(8191)],
    }
    return files, numbers


# subcommands -------------------------------------------------------------------------------
#: --measured rotates samples × distances vectors of head_dim channels at once (float64)
_MEASURED_ELEMENTS = 2**25


def _decay(args: argparse.Namespace) -> int:
    if not args.base > 1:  # as every RoPE base (docs/scaling.md), with or without --measured
        raise InputError(f"--base must be > 1 (frequencies base ** (-2i/d) fall from 1 rad/token), got {args.base:g}")
    if args.head_dim % 2:
        raise InputError(f"--head-dim must be even (channels rotate in pairs), got {args.head_dim}")
    elements = args.samples * (args.max_distance + 1) * args.head_dim
    if args.measured and elements > _MEASURED_ELEMENTS:
        raise InputError(
            f"--measured with --samples {args.samples}, --max-distance {args.max_distance} and --head-dim "
            f"{args.head_dim} rotates {elements * 8 / 2**30:.1f} GiB of vectors at once; lower one of them"
        )
    out = output_stem(args.out, "decay")
    files, numbers = make_decay(out, args.head_dim, args.base, args.max_distance, args.measured, args.samples)
    return _announce(args, files, numbers)


def _pca_positions(text: str) -> int:
    """argparse type of plot positions --seq-len: a 2-D PCA of the tables needs 3 positions or more."""
    value = seq_len_count(text)
    if value < 3:
        raise argparse.ArgumentTypeError(f"must be at least 3 (a 2-D PCA needs three positions), got {text}")
    return value


def _config_file(path: str) -> argparse.Namespace:
    """The arguments that describe one config file as it is (no flag overrides), every layer type."""
    return argparse.Namespace(
        config=path, layer_type=None, all_layer_types=True, **dict.fromkeys(FLAG_DEFAULTS), interleaved=None
    )


def _frequencies(args: argparse.Namespace) -> int:
    ropes: dict[str, RoPE] = {}
    for path in args.configs:
        found = configurations(_config_file(path))
        for c in found:
            label = config_label(path) + (f" ({c.layer_type})" if len(found) > 1 else "")
            ropes[label] = c.rope
    head_dim = args.head_dim or FLAG_DEFAULTS["head_dim"]
    for base in args.base or ([] if args.configs else [10000.0, 500000.0]):
        ropes[f"d={head_dim}, base {base:g}"] = RoPE(head_dim, base=base)
    files, numbers = make_frequencies(output_stem(args.out, "frequencies"), ropes, args.context)
    return _announce(args, files, numbers)


#: configuration flags that only make sense with CONFIG or --scaling in ``plot scaling``
_NEED_A_CONFIGURATION = {
    "rotary_dim": "--rotary-dim",
    "max_position": "--max-position",
    "interleaved": "--interleaved",
    "pairing": "--pairing",
    "layer_type": "--layer-type",
}


def _scaling(args: argparse.Namespace) -> int:
    if args.config or args.scaling:
        if args.rope_type:
            raise InputError("give --rope-type only without CONFIG / --scaling")
        found = configurations(argparse.Namespace(**vars(args), all_layer_types=True))
        out_dir = output_directory(args.out)
        all_files: list[Path] = []
        methods: dict[str, Any] = {}
        for c in found:
            name = c.rope.freqs.rope_type + (f"_{c.layer_type}" if len(found) > 1 else "")
            files, numbers = make_scaling(out_dir / f"scaling_{name}", c.rope, c.context, args.seq_len)
            all_files += files
            methods[name] = numbers
        return _announce(args, all_files, {"methods": methods})
    given = [
        flag_as_given(flag, getattr(args, key))
        for key, flag in _NEED_A_CONFIGURATION.items()
        if getattr(args, key, None) is not None
    ]
    if given:
        raise InputError(
            f"{', '.join(given)} describe a configuration: give CONFIG or --scaling with them, or drop them"
        )
    available = [t for t in ROPE_TYPES if t != "default"]
    wanted = args.rope_type or [t for t in available if ROPE_TYPES[t].example is not None]
    unknown = [t for t in wanted if t not in ROPE_TYPES or t == "default"]
    if unknown:
        raise InputError(f"unknown scaling rope_type {unknown[0]!r}; registered: {', '.join(available) or 'none'}")
    head_dim = args.head_dim or FLAG_DEFAULTS["head_dim"]
    out_dir = output_directory(args.out)
    all_files = []
    methods = {}
    for t in dict.fromkeys(wanted):
        make_example = ROPE_TYPES[t].example
        if make_example is None:
            raise InputError(
                f'no example parameters for rope_type {t!r}; pass --scaling \'{{"rope_type": "{t}", ...}}\''
            )
        example = make_example(head_dim)
        block, base, max_position, seq_len = example.block, example.base, example.max_position, example.seq_len
        note = example.note or ", ".join(f"{k}={v:g}" for k, v in block.items() if isinstance(v, float))
        if args.base:
            base = args.base
        if args.seq_len:
            seq_len = args.seq_len
        rope = RoPE(head_dim, base=base, scaling=block, max_position=max_position)
        if seq_len is not None:
            note += f", at {seq_len} tokens"
        files, numbers = make_scaling(
            out_dir / f"scaling_{t}", rope, max_position, seq_len, note=f"d={head_dim}, base {base:g}; {note}"
        )
        all_files += files
        methods[t] = numbers
    return _announce(args, all_files, {"methods": methods})


def _per_layer_type(args: argparse.Namespace, name: str, make) -> int:
    """One figure, or one per layer type (``STEM_<layer type>``); ``make(stem, rope)`` -> (files, numbers)."""
    found = every_layer_type(args)
    stem = output_stem(args.out, name)
    files: list[Path] = []
    numbers: dict[str, Any] = {}
    for c in found:
        made, nums = make(stem.with_name(stem.name + layer_type_suffix(c, len(found))), c.rope)
        files += made
        numbers[c.layer_type] = nums
    if len(found) == 1:
        return _announce(args, files, next(iter(numbers.values())))
    return _announce(args, files, {"layer_types": numbers})


def _scores(args: argparse.Namespace) -> int:
    return _per_layer_type(
        args, "scores", lambda stem, rope: make_scores(stem, rope, args.seq_len, args.q, args.k, args.seed)
    )


def _positions(args: argparse.Namespace) -> int:
    return _per_layer_type(args, "positions", lambda stem, rope: make_positions(stem, rope, args.seq_len))


def _axial(args: argparse.Namespace) -> int:
    check_heads_need_mixed(args)
    heads = 4 if args.heads is None else args.heads
    presets = list(args.preset or ([] if args.mixed else AXIAL_FIGURE_PRESETS))
    if args.head_dim is not None and args.head_dim % 2:
        raise InputError(f"--head-dim must be even (channels rotate in pairs), got {args.head_dim}")
    cells = (2 * args.extent + 1) ** 2
    elements = cells * (args.head_dim or 64) * (heads if args.mixed else 1)
    if elements > _MEASURED_ELEMENTS:
        raise InputError(
            f"--extent {args.extent} ({cells} offsets) with --head-dim {args.head_dim or 64}"
            + (f" and --heads {heads}" if args.mixed else "")
            + f" rotates {elements * 8 / 2**30:.1f} GiB of vectors at once; lower one of them"
        )
    out = output_stem(args.out, "axial")
    files, numbers = make_axial(out, presets, args.head_dim, args.mixed, heads, args.extent, args.random, args.seed)
    return _announce(args, files, numbers)


def _learnable(args: argparse.Namespace) -> int:
    files, numbers = make_learnable(output_stem(args.out, "learnable"), args.steps, args.seed)
    return _announce(args, files, numbers)


def _variants(args: argparse.Namespace) -> int:
    files, numbers = make_variants(output_directory(args.out))
    return _announce(args, files, numbers)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="figures: decay, frequencies, scaling, scores, positions, axial, learnable, variants (PNG + SVG)",
        description="Each figure is written as PNG and SVG. -o/--out is a file stem for one figure (an existing "
        "directory gets the default name inside it) and a directory for plot scaling and plot variants; "
        "directories are created.",
    )
    figs = p.add_subparsers(dest="figure", metavar="FIGURE", parser_class=type(p), required=True)

    def common(q: argparse.ArgumentParser, default_out: str, kind: str = "stem") -> None:
        what = "directory for the figures" if kind == "dir" else "output file stem (.png and .svg are written)"
        add_output_argument(q, kind, default_out, what)
        q.add_argument("--json", action="store_true", help="print the files written and the numbers plotted as JSON")

    q = figs.add_parser(
        "decay",
        help="long-range decay bound of RoPE (RoFormer paper) against relative distance",
        description='The long-term decay bound (1/(d/2)) Σ_j |S_j| of the paper "RoFormer: Enhanced Transformer with '
        'Rotary Position Embedding" and of Su Jianlin\'s blog post "Transformer upgrade road: 2. Rotary position '
        'embedding", against the relative distance; --measured adds the mean |<R_m q, R_n k>| of rotated vectors.',
    )
    q.add_argument("--head-dim", type=head_dim_count, default=128, help="channels per head d (default 128)")
    q.add_argument("--base", type=positive_float, default=10000.0, help="rope_theta (default 10000)")
    q.add_argument(
        "--max-distance",
        type=count(65536, "2**16 distances"),
        default=256,
        help="largest relative distance (default 256)",
    )
    q.add_argument(
        "--measured", action="store_true", help="overlay measured mean |⟨R_m q, R_n k⟩| (random q, k and all ones)"
    )
    q.add_argument(
        "--samples", type=count(65536, "2**16 pairs"), default=256, help="random (q, k) pairs for --measured"
    )
    common(q, "decay")
    q.set_defaults(func=_decay)

    q = figs.add_parser("frequencies", help="wavelength per pair, several configurations overlaid")
    q.add_argument(
        "configs", nargs="*", metavar="CONFIG", help="config.json files to overlay (every layer type of each)"
    )
    q.add_argument(
        "--base", type=positive_float, action="append", help="add a default configuration with this base (repeatable)"
    )
    q.add_argument("--head-dim", type=head_dim_count, help="head_dim of the --base configurations (default 128)")
    q.add_argument("--context", type=length_count, help="draw a line at this context length")
    common(q, "frequencies")
    q.set_defaults(func=_frequencies)

    q = figs.add_parser(
        "scaling",
        help="original vs scaled wavelength per pair for each scaling method",
        description="Without CONFIG or --scaling: one figure per registered scaling method with example parameters "
        "(--head-dim, --base and --seq-len apply to the examples). With them: the figure of that configuration "
        "(one per layer type for a config with one RoPE block per layer type).",
    )
    add_config_arguments(q)
    q.add_argument(
        "--rope-type", action="append", help="scaling methods to draw with example parameters (default: all registered)"
    )
    q.add_argument("--seq-len", type=length_count, help="sequence length for length-dependent types")
    common(q, "scaling", kind="dir")
    q.set_defaults(func=_scaling)

    per_layer_type = (
        "A config with one RoPE block per layer type (Gemma-3) gives one figure per layer type, PATH_<layer type>, "
        "unless --layer-type picks one."
    )
    q = figs.add_parser(
        "scores", help="attention logits of rotated q, k as a heatmap over positions", description=per_layer_type
    )
    add_config_arguments(q)
    q.add_argument("--seq-len", type=seq_len_count, default=64, help="positions (default 64)")
    q.add_argument("--q", help="query content vector [head_dim] (.npy or .pt); default random")
    q.add_argument("--k", help="key content vector [head_dim] (.npy or .pt); default random")
    q.add_argument("--seed", type=seed, default=0, help="seed of the random q, k (default 0)")
    common(q, "scores")
    q.set_defaults(func=_scores)

    q = figs.add_parser("positions", help="2-D PCA of the position tables", description=per_layer_type)
    add_config_arguments(q)
    q.add_argument("--seq-len", type=_pca_positions, default=256, help="positions, at least 3 (default 256)")
    common(q, "positions")
    q.set_defaults(func=_positions)

    from rotary.variants import PRESETS

    q = figs.add_parser(
        "axial",
        help="2-D RoPE: attention score against the offset (Δh, Δw) for axial presets and RoPE-Mixed heads",
        description="One heatmap per axial preset (default: " + ", ".join(AXIAL_FIGURE_PRESETS) + ") or, with --mixed, "
        'per head of a RoPE-Mixed ("Rotary Position Embedding for Vision Transformer"); scores relative to no offset.',
    )
    q.add_argument("--preset", action="append", choices=list(PRESETS), help="axial preset to draw (repeatable)")
    q.add_argument("--mixed", action="store_true", help="draw the heads of a RoPE-Mixed with random per-head angles")
    q.add_argument(
        "--heads", type=count(16, "one panel per head"), help="RoPE-Mixed heads to draw (default 4; needs --mixed)"
    )
    q.add_argument("--head-dim", type=head_dim_count, help="channels per head (default: each preset's; 64 for --mixed)")
    q.add_argument(
        "--extent",
        type=count(256, "a heatmap of 513 x 513 offsets"),
        default=16,
        help="largest offset per axis, in patches (default 16)",
    )
    q.add_argument("--random", action="store_true", help="random q, k instead of all ones")
    q.add_argument("--seed", type=seed, default=0, help="seed of the RoPE-Mixed angles and the random q, k (default 0)")
    common(q, "axial")
    q.set_defaults(func=_axial)

    q = figs.add_parser(
        "learnable", help="learnable frequencies fitting a teacher's attention scores (a short training run)"
    )
    q.add_argument(
        "--steps",
        type=count(10000, "each step is a forward and backward pass; 150 already fit"),
        default=150,
        help="training steps (default 150)",
    )
    q.add_argument("--seed", type=seed, default=0, help="seed of the training data (default 0)")
    common(q, "learnable")
    q.set_defaults(func=_learnable)

    q = figs.add_parser(
        "variants", help="the figures of docs/variants.md: M-RoPE slots, xPos decay, p-RoPE and NoPE layers"
    )
    common(q, "figures", kind="dir")
    q.set_defaults(func=_variants)
