"""``rotary plot {decay,frequencies,scaling,scores,positions}``: figures as PNG + SVG."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from rotary import analysis
from rotary.frequencies import frequencies
from rotary.module import RoPE
from rotary.rope_types import ROPE_TYPES

from .common import (
    _FLAG_DEFAULTS,
    add_config_arguments,
    add_output_argument,
    config_label,
    configurations,
    count,
    head_dim_count,
    length_count,
    output_directory,
    output_stem,
    positive_float,
    print_json,
    rope_from_args,
    seed,
    seq_len_count,
)

__all__ = ["register", "make_decay", "make_frequencies", "make_scaling", "make_scores", "make_positions"]

def _announce(args: argparse.Namespace, files: list[Path], numbers: dict[str, Any]) -> int:
    if args.json:
        print_json({"files": [str(f) for f in files], **numbers})
    else:
        for f in files:
            print(f"wrote {f}")
    return 0


# the five figures: each returns (files, numbers) -------------------------------------------------
def make_decay(out: Path, head_dim: int, base: float, max_distance: int, measured: bool, samples: int = 256):
    from rotary import plots

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
    from rotary import plots

    series = {label: analysis.scaling_profile(r.freqs).wavelength for label, r in ropes.items()}
    fig = plots.plot_frequencies(series, context=context)
    return plots.save(fig, out), {"wavelengths": series}


def make_scaling(out: Path, rope: RoPE, context: int, seq_len: int | None = None, note: str = ""):
    from rotary import plots

    f = rope.freqs
    if seq_len is not None:
        f = frequencies(f.head_dim, base=f.base, rotary_dim=f.rotary_dim, scaling=dict(f.scaling), seq_len=seq_len)
    profile = analysis.scaling_profile(f)
    trained = f.scaling.get("original_max_position_embeddings") or f.scaling.get("max_position_embeddings") or context
    fig = plots.plot_scaling(profile, rope_type=f.rope_type, context=trained, note=note)
    numbers = {
        "rope_type": f.rope_type, "scaling": dict(f.scaling), "attention_scaling": f.attention_scaling,
        "seq_len": seq_len, "full_factor": profile.full_factor, "kind": profile.kind, "factor": profile.factor,
        "ramp": profile.ramp, "wavelength": profile.wavelength, "original_wavelength": profile.original_wavelength,
        "interpolated_pairs": profile.pairs_of("interpolated"), "blended_pairs": profile.pairs_of("blended"),
        "extrapolated_pairs": profile.pairs_of("extrapolated"),
    }
    return plots.save(fig, out), numbers


def _load_vector(path: str, head_dim: int) -> torch.Tensor:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if p.suffix == ".npy":
        import numpy as np

        v = torch.from_numpy(np.load(p))
    elif p.suffix == ".pt":
        v = torch.load(p, weights_only=True)
    else:
        raise ValueError(f"{path}: q/k files must be .npy or .pt holding a [{head_dim}] vector")
    if not isinstance(v, torch.Tensor) or v.shape != (head_dim,):
        shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
        raise ValueError(f"{path} holds shape {shape}; expected a [{head_dim}] vector (head_dim)")
    return v.double()


def make_scores(out: Path, rope: RoPE, seq_len: int, q: str | None = None, k: str | None = None, seed: int = 0):
    from rotary import plots

    d = rope.head_dim
    g = torch.Generator().manual_seed(seed)
    qv = _load_vector(q, d) if q else torch.randn(d, generator=g, dtype=torch.float64)
    kv = _load_vector(k, d) if k else torch.randn(d, generator=g, dtype=torch.float64)
    scores = analysis.score_matrix(rope, qv, kv, seq_len)
    source = "given" if q or k else f"random (seed {seed})"
    fig = plots.plot_scores(scores, title=f"Attention logits ⟨R_m q, R_n k⟩ of rotated q, k ({source})")
    return plots.save(fig, out), {"seq_len": seq_len, "logit_by_distance": scores[:, 0].tolist()}


def make_positions(out: Path, rope: RoPE, seq_len: int):
    from rotary import plots

    coords, explained = analysis.position_pca(rope, seq_len)
    fig = plots.plot_positions(coords, explained)
    return plots.save(fig, out), {"seq_len": seq_len, "explained_variance_ratio": explained.tolist()}


# subcommands -------------------------------------------------------------------------------
#: --measured rotates samples × distances vectors of head_dim channels at once (float64)
_MEASURED_ELEMENTS = 2**25


def _decay(args: argparse.Namespace) -> int:
    if args.head_dim % 2:
        raise ValueError(f"--head-dim must be even (channels rotate in pairs), got {args.head_dim}")
    elements = args.samples * (args.max_distance + 1) * args.head_dim
    if args.measured and elements > _MEASURED_ELEMENTS:
        raise ValueError(
            f"--measured with --samples {args.samples}, --max-distance {args.max_distance} and --head-dim {args.head_dim} "
            f"rotates {elements * 8 / 2**30:.1f} GiB of vectors at once; lower one of them"
        )
    out = output_stem(args.out, "decay")
    files, numbers = make_decay(out, args.head_dim, args.base, args.max_distance, args.measured, args.samples)
    return _announce(args, files, numbers)


def _config_file(path: str) -> argparse.Namespace:
    """The arguments that describe one config file as it is (no flag overrides), every layer type."""
    return argparse.Namespace(config=path, layer_type=None, all_layer_types=True, **dict.fromkeys(_FLAG_DEFAULTS), interleaved=None)


def _frequencies(args: argparse.Namespace) -> int:
    ropes: dict[str, RoPE] = {}
    for path in args.configs:
        found = configurations(_config_file(path))
        for c in found:
            label = config_label(path) + (f" ({c.layer_type})" if len(found) > 1 else "")
            ropes[label] = c.rope
    head_dim = args.head_dim or _FLAG_DEFAULTS["head_dim"]
    for base in args.base or ([] if args.configs else [10000.0, 500000.0]):
        ropes[f"d={head_dim}, base {base:g}"] = RoPE(head_dim, base=base)
    files, numbers = make_frequencies(output_stem(args.out, "frequencies"), ropes, args.context)
    return _announce(args, files, numbers)


#: configuration flags that only make sense with CONFIG or --scaling in ``plot scaling``
_NEED_A_CONFIGURATION = {"rotary_dim": "--rotary-dim", "max_position": "--max-position", "interleaved": "--interleaved", "layer_type": "--layer-type"}


def _scaling(args: argparse.Namespace) -> int:
    if args.config or args.scaling:
        if args.rope_type:
            raise ValueError("give --rope-type only without CONFIG / --scaling")
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
    given = [flag for key, flag in _NEED_A_CONFIGURATION.items() if getattr(args, key, None) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} describe a configuration: give CONFIG or --scaling with them, or drop them")
    available = [t for t in ROPE_TYPES if t != "default"]
    wanted = args.rope_type or [t for t in available if ROPE_TYPES[t].example is not None]
    unknown = [t for t in wanted if t not in ROPE_TYPES or t == "default"]
    if unknown:
        raise ValueError(f"unknown scaling rope_type {unknown[0]!r}; registered: {', '.join(available) or 'none'}")
    head_dim = args.head_dim or _FLAG_DEFAULTS["head_dim"]
    out_dir = output_directory(args.out)
    all_files = []
    methods = {}
    for t in dict.fromkeys(wanted):
        make_example = ROPE_TYPES[t].example
        if make_example is None:
            raise ValueError(f"no example parameters for rope_type {t!r}; pass --scaling '{{\"rope_type\": \"{t}\", ...}}'")
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
        files, numbers = make_scaling(out_dir / f"scaling_{t}", rope, max_position, seq_len, note=f"d={head_dim}, base {base:g}; {note}")
        all_files += files
        methods[t] = numbers
    return _announce(args, all_files, {"methods": methods})


def _scores(args: argparse.Namespace) -> int:
    out = output_stem(args.out, "scores")
    files, numbers = make_scores(out, rope_from_args(args)[0], args.seq_len, args.q, args.k, args.seed)
    return _announce(args, files, numbers)


def _positions(args: argparse.Namespace) -> int:
    out = output_stem(args.out, "positions")
    files, numbers = make_positions(out, rope_from_args(args)[0], args.seq_len)
    return _announce(args, files, numbers)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot", help="figures: decay, frequencies, scaling, scores, positions (PNG + SVG)",
        description="Each figure is written as PNG and SVG. -o/--out is a file stem for one figure (an existing "
        "directory gets the default name inside it) and a directory for plot scaling; directories are created.",
    )
    figs = p.add_subparsers(dest="figure", metavar="FIGURE", parser_class=type(p), required=True)

    def common(q: argparse.ArgumentParser, default_out: str, kind: str = "stem") -> None:
        what = "directory for the figures" if kind == "dir" else "output file stem (.png and .svg are written)"
        add_output_argument(q, kind, default_out, what)
        q.add_argument("--json", action="store_true", help="print the files written and the numbers plotted as JSON")

    q = figs.add_parser(
        "decay", help="long-range decay bound of RoPE (RoFormer paper) against relative distance",
        description="The long-term decay bound (1/(d/2)) Σ_j |S_j| of the paper \"RoFormer: Enhanced Transformer with "
        "Rotary Position Embedding\" and of Su Jianlin's blog post \"Transformer upgrade road: 2. Rotary position "
        "embedding\", against the relative distance; --measured adds the mean |<R_m q, R_n k>| of rotated vectors.",
    )
    q.add_argument("--head-dim", type=head_dim_count, default=128, help="channels per head d (default 128)")
    q.add_argument("--base", type=positive_float, default=10000.0, help="rope_theta (default 10000)")
    q.add_argument("--max-distance", type=count(65536, "2**16 distances"), default=256, help="largest relative distance (default 256)")
    q.add_argument("--measured", action="store_true", help="overlay measured mean |⟨R_m q, R_n k⟩| (random q, k and all ones)")
    q.add_argument("--samples", type=count(65536, "2**16 pairs"), default=256, help="random (q, k) pairs for --measured")
    common(q, "decay")
    q.set_defaults(func=_decay)

    q = figs.add_parser("frequencies", help="wavelength per pair, several configurations overlaid")
    q.add_argument("configs", nargs="*", metavar="CONFIG", help="config.json files to overlay (every layer type of each)")
    q.add_argument("--base", type=positive_float, action="append", help="add a default configuration with this base (repeatable)")
    q.add_argument("--head-dim", type=head_dim_count, help="head_dim of the --base configurations (default 128)")
    q.add_argument("--context", type=length_count, help="draw a line at this context length")
    common(q, "frequencies")
    q.set_defaults(func=_frequencies)

    q = figs.add_parser(
        "scaling", help="original vs scaled wavelength per pair for each scaling method",
        description="Without CONFIG or --scaling: one figure per registered scaling method with example parameters "
        "(--head-dim, --base and --seq-len apply to the examples). With them: the figure of that configuration "
        "(one per layer type for a config with one RoPE block per layer type).",
    )
    add_config_arguments(q)
    q.add_argument("--rope-type", action="append", help="scaling methods to draw with example parameters (default: all registered)")
    q.add_argument("--seq-len", type=length_count, help="sequence length for length-dependent types")
    common(q, "scaling", kind="dir")
    q.set_defaults(func=_scaling)

    q = figs.add_parser("scores", help="attention logits of rotated q, k as a heatmap over positions")
    add_config_arguments(q)
    q.add_argument("--seq-len", type=seq_len_count, default=64, help="positions (default 64)")
    q.add_argument("--q", help="query content vector [head_dim] (.npy or .pt); default random")
    q.add_argument("--k", help="key content vector [head_dim] (.npy or .pt); default random")
    q.add_argument("--seed", type=seed, default=0, help="seed of the random q, k (default 0)")
    common(q, "scores")
    q.set_defaults(func=_scores)

    q = figs.add_parser("positions", help="2-D PCA of the position tables")
    add_config_arguments(q)
    q.add_argument("--seq-len", type=seq_len_count, default=256, help="positions (default 256)")
    common(q, "positions")
    q.set_defaults(func=_positions)
