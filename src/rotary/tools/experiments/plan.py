"""Which models a run trains, in which order, and what each is called (:class:`ModelSpec`, per seed).

The main comparison: one model per position encoding at ``L`` (stage ``pretrain``); with the extension stage,
the RoPE model fine-tuned at ``E = extend_length`` with each of ``extend_scalings`` (``extend``) and a RoPE
model trained from scratch at ``E`` on the same token budget (``scratch``); with ``task_steps``, a task model
per encoding (``task``). ``--study base``: a RoPE model per base. ``--study transfer``: sinusoidal and RoPE
models, and a shorter sinusoidal model moved to RoPE (:func:`rotary.models.transfer_position_encoding`), as is
and fine-tuned. A model that starts from another (``parent``) comes after it, with the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InputError
from .config import SCALINGS, ExperimentConfig

__all__ = [
    "ENCODING_LABELS",
    "SCALING_LABELS",
    "STAGES",
    "TASK_PREFIX",
    "ModelSpec",
    "model_specs",
    "scaling_block",
]

#: how each position encoding is called in tables and figures
ENCODING_LABELS = {
    "none": "NoPE",
    "learned": "learned absolute",
    "sinusoidal": "sinusoidal",
    "alibi": "ALiBi",
    "rope": "RoPE",
    "rope_alibi": "RoPE + ALiBi",
    "rope_relative": "RoPE + learned bias",
    "xpos": "RoPE + xPos",
}

#: how each scaling is called in tables and figures
SCALING_LABELS = {"none": "", "linear": "PI (linear)", "ntk": "NTK", "dynamic": "dynamic NTK", "yarn": "YaRN"}

#: pretrain: from a fresh initialisation at L; extend: fine-tuned at a longer length from a pretrained
#: model; scratch: from a fresh initialisation at the longer length; transfer: another encoding's weights;
#: task: from a fresh initialisation on the synthetic tasks (:mod:`.tasks`) at ``task_length``
STAGES = ("pretrain", "extend", "scratch", "transfer", "task")

#: the name of the task model of an encoding
TASK_PREFIX = "task-"


@dataclass(frozen=True)
class ModelSpec:
    """One model to train.

    ``model`` is its name over seeds (``rope-ft-yarn``), ``encoding`` a key of ``POSITION_ENCODINGS``; ``stage``
    one of :data:`STAGES`; ``steps`` 0 is a transfer without fine-tuning; ``scaling`` is trained and evaluated at
    factor ``length / L``; ``parent`` (same seed) is the model it starts from, and ``first_batch`` its first batch's
    index in the seed's stream (a fine-tune continues its parent's).
    """

    model: str
    encoding: str
    seed: int
    label: str
    stage: str = "pretrain"
    length: int = 128
    steps: int = 1
    rows: int = 1
    scaling: str = "none"
    parent: str | None = None
    rope_base: float = 10000.0
    first_batch: int = 0

    @property
    def name(self) -> str:
        """Unique in a run: ``<model>-<seed>`` (its directory under ``models/``)."""
        return f"{self.model}-{self.seed}"

    @property
    def parent_name(self) -> str | None:
        return None if self.parent is None else f"{self.parent}-{self.seed}"

    @property
    def fine_tune(self) -> bool:
        """Whether it continues from another model's weights (and uses the fine-tuning schedule)."""
        return self.parent is not None


def _pretrain(config: ExperimentConfig, encoding: str, seed: int, **changes) -> ModelSpec:
    fields = dict(
        model=encoding,
        encoding=encoding,
        seed=seed,
        label=ENCODING_LABELS.get(encoding, encoding),
        stage="pretrain",
        length=config.train_length,
        steps=config.steps,
        rows=config.batch_size,
        rope_base=config.rope_base,
    )
    return ModelSpec(**{**fields, **changes})


def _main(config: ExperimentConfig, seed: int) -> list[ModelSpec]:
    specs = [_pretrain(config, e, seed) for e in config.encodings]
    if config.extends:
        length, at = config.extension_length, f"{config.extension_length / config.train_length:g}L"
        for s in config.extend_scalings:
            label = f"RoPE + {SCALING_LABELS[s]}, fine-tuned at {at}" if s != "none" else f"RoPE, fine-tuned at {at}"
            specs.append(
                _pretrain(
                    config,
                    "rope",
                    seed,
                    model=f"rope-ft-{s}",
                    label=label,
                    stage="extend",
                    length=length,
                    steps=config.extend_steps,
                    rows=config.extension_rows,
                    scaling=s,
                    parent="rope",
                )
            )
        specs.append(
            _pretrain(
                config,
                "rope",
                seed,
                model="rope-scratch",
                label=f"RoPE trained at {at}",
                stage="scratch",
                length=length,
                rows=config.extension_rows,
            )
        )
    if config.has_tasks and (config.task_seeds is None or seed < config.seed + config.task_seeds):
        for e in config.encodings:
            specs.append(
                _pretrain(
                    config,
                    e,
                    seed,
                    model=TASK_PREFIX + e,
                    label=ENCODING_LABELS.get(e, e),
                    stage="task",
                    length=config.task_length,
                    steps=config.task_steps,
                    rows=config.task_batch_size,
                )
            )
    return specs


def _base(config: ExperimentConfig, seed: int) -> list[ModelSpec]:
    return [
        _pretrain(config, "rope", seed, model=f"rope-base{b:g}", label=f"RoPE, base {b:g}", rope_base=float(b))
        for b in config.bases
    ]


def _transfer(config: ExperimentConfig, seed: int) -> list[ModelSpec]:
    tune = config.transfer_finetune_steps
    short = config.steps - tune
    return [
        _pretrain(config, "sinusoidal", seed, label=f"sinusoidal, {config.steps} steps"),
        _pretrain(config, "rope", seed, label=f"RoPE, {config.steps} steps"),
        _pretrain(
            config, "sinusoidal", seed, model="sinusoidal-short", label=f"sinusoidal, {short} steps", steps=short
        ),
        _pretrain(
            config,
            "rope",
            seed,
            model="transfer-0",
            label=f"sinusoidal ({short} steps) → RoPE, not fine-tuned",
            stage="transfer",
            steps=0,
            parent="sinusoidal-short",
        ),
        _pretrain(
            config,
            "rope",
            seed,
            model="transfer",
            label=f"sinusoidal ({short} steps) → RoPE + {tune} steps",
            stage="transfer",
            steps=tune,
            parent="sinusoidal-short",
            first_batch=short,
        ),
    ]


def model_specs(config: ExperimentConfig) -> list[ModelSpec]:
    """Every model of a run, seed after seed; a model after the one it starts from.

    >>> cfg = ExperimentConfig(
    ...     encodings=("none", "rope"), seeds=2, extend_steps=10, extend_scalings=("yarn",), task_steps=0
    ... )
    >>> [s.name for s in model_specs(cfg)]
    ['none-0', 'rope-0', 'rope-ft-yarn-0', 'rope-scratch-0', 'none-1', 'rope-1', 'rope-ft-yarn-1', 'rope-scratch-1']
    >>> [s.name for s in model_specs(ExperimentConfig(study="base", bases=(100, 10000), seeds=1))]
    ['rope-base100-0', 'rope-base10000-0']
    """
    plan = {None: _main, "base": _base, "transfer": _transfer}[config.study]
    return [spec for k in range(config.seeds) for spec in plan(config, config.seed + k)]


def scaling_block(name: str, factor: float, train_length: int) -> dict | None:
    """The ``rope_scaling`` block of scaling ``name`` at ``factor`` (``dynamic``: transformers' dynamic NTK).

    >>> scaling_block("yarn", 4.0, 128), scaling_block("none", 4.0, 128)
    ({'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 128}, None)
    """
    if name not in SCALINGS:
        raise InputError(f"unknown scaling {name!r}; known: {', '.join(SCALINGS)}")
    factor = float(factor)
    if name == "none":
        return None
    if name in ("linear", "ntk"):
        return {"rope_type": name, "factor": factor}
    if name == "dynamic":
        return {"rope_type": "dynamic", "factor": factor, "max_position_embeddings": train_length}
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": train_length}
