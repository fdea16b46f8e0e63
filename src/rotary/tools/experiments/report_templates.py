"""The prose of ``report.md``, as ``str.format`` templates: each names the values it takes, and
:mod:`.report` fills them from a run's data. Editing what the report says happens here; what it
measures stays in :mod:`.report` and :mod:`.tables`."""

from __future__ import annotations

# the title ----------------------------------------------------------------------------------------

TITLE_BASE = "RoPE's base: {bases} bases, trained at L = {L} and tested longer"
TITLE_TRANSFER = "From sinusoidal positions to RoPE: copy every other weight, fine-tune, compare"
TITLE_MAIN = "Train short, test long: {encodings} position encodings, {scalings} RoPE scalings{extension}"
TITLE_EXTENSION = ", fine-tuned at {factor:g}L"

COMMAND = "Command: `{command}`  "
FINISHED = (
    "Finished {finished} in {minutes:.1f} min on {cpu} ({threads}, {device}, {world_size} process(es)); "
    "torch {torch}, rotary {rotary}.{load}"
)
LOAD = " Load average (1 min) {start:g} at the start, {end:g} at the end."
NO_FIGURES = (
    "No figures: the run was made with `--no-figures`. Its command with `--resume` and this directory draws them "
    "from the stored numbers, without training again."
)

# Setup --------------------------------------------------------------------------------------------

SETUP_TEXT = (
    "- **Text**: {source} ({bytes:,} bytes from {files:,} file(s){skipped}, sha256 `{sha256}…`), one token per "
    "byte (vocabulary 256). The first {train_fraction:.0%} trains; the last {held_out_fraction:.0%} is held out."
)
SETUP_SKIPPED = ", {skipped:,} skipped as not UTF-8 text"
SETUP_MODELS = (
    "- **Models**: `rotary.models.Decoder`, {num_layers} layers, width {hidden_size}, {num_heads} heads of "
    "{head_dim}, SwiGLU, RMSNorm; parameters: {sizes}."
)
SETUP_TRAINING = (
    "- **Training**: L = {L} tokens, {steps} AdamW steps of {batch_size} rows ({tokens:,} tokens per model), "
    "learning rate {learning_rate:g} → {min_learning_rate:g} (cosine, {warmup_steps} warm-up steps). "
    "{passkey_fraction:.0%} of the rows end with a passkey sample no longer than the row."
)
SETUP_SEEDS = (
    "- **Seeds**: every method is trained {seeds} time(s), seeds {first} to {last} (initialisation and batch "
    "order); tables give the mean ± half the range over the seeds, and every comparison with a paper is made "
    "seed by seed."
)
SETUP_EXTENSION = (
    "- **Extension stage**: the RoPE model of each seed fine-tuned at E = {E} ({factor:g}L) for {steps} steps of "
    "{rows} rows ({step_share:.0%} of the pretraining steps, {token_share:.0%} of its tokens), fresh AdamW, "
    "{warmup} warm-up steps to {finetune_learning_rate:g}, cosine to {min_learning_rate:g}; with {scalings}. "
    "Beside them, RoPE trained from scratch at E: {scratch_steps} steps of {rows} rows ({scratch_tokens:,} tokens)."
)
EXTENSION_DIRECT = "no scaling (direct fine-tuning)"
EXTENSION_SCALED = "{label} at factor {factor:g}"
SETUP_TRANSFER = (
    "- **Transfer**: a sinusoidal model of {short} steps moved to RoPE by "
    "`rotary.models.transfer_position_encoding` (every weight outside the position encoding copied), measured as "
    "it is and after {tune} more steps (fresh AdamW, {warmup} warm-up steps to {finetune_learning_rate:g}, the "
    "batches the sinusoidal model would have seen next)."
)
SETUP_TASKS = (
    "- **Task models**: beside the text models, one per position encoding and seed{seeds} trained from scratch "
    "on the synthetic copy and associative-recall tasks (`rotary.tools.experiments.tasks`, generated on the "
    "fly): width {task_hidden_size}, {num_layers} layers, {num_heads} heads, {task_steps} steps of "
    "{task_batch_size} rows of {task_length} bytes (half copy, half recall; loss on the answers only), learning "
    "rate {task_learning_rate:g} → {final_learning_rate:g}. Evaluated at {lengths} bytes on {task_trials} rows "
    "per task, length and seed (the same rows for every model), RoPE's with each scaling at factor "
    "E / {task_length}.{sizes}"
)
TASK_SEEDS = " (the first {task_seeds} of the {seeds} seeds, seed {seed}{last})"
TASK_SIZES = " Parameters: {sizes}."
EVALUATION = (
    "- **Evaluation** at E = {lengths}: perplexity on {eval_tokens:,} held-out bytes in non-overlapping windows of E"
)
EVALUATION_SLIDING = (
    ", and {sliding_tokens:,} of the same bytes (strides of {stride} spread over them) in sliding windows of E, "
    "each scoring its last {stride} (every scored byte sees at least E − {stride} bytes of context)"
)
EVALUATION_BUCKETS = "; the loss by query position in bins of {bin} on the {longest}-token windows"
EVALUATION_PASSKEY = (
    "; passkey retrieval ({trials} prompts per length and seed at depths {depths}, greedy decoding, all 5 digits exact)"
)
EVALUATION_RETRIEVAL = "; the retrieval probe at distances {distances} ({trials} random {span}-byte spans each)"
SETUP_SCALINGS = (
    "- **RoPE scalings** of the pretrained RoPE model at inference time, factor E / L, weights unchanged: {scalings}."
)
LEARNED_TABLE = (
    "- **Learned absolute table**: sized to {longest} positions; rows {L}..{last} never receive a gradient and are "
    "not weight-decayed: checked after training, {state}."
)

# the main comparison ------------------------------------------------------------------------------

WINDOWS_CAPTION = "Non-overlapping windows (each window predicted from its own bytes only):"
SLIDING_CAPTION = "Sliding windows (stride {stride}: every scored byte sees at least E − {stride} bytes):"
POSITIONS_CAPTION = (
    "Mean next-byte loss (nats) of queries in each range of positions. A method that only lacks context gets "
    "better to the right; a method that breaks at positions it never saw gets worse."
)
RETRIEVAL_CAPTION = (
    "Retrieval gain in nats per byte (control loss minus copy loss on the second copy of a random {span}-byte "
    "span) at each distance between the copies; 0 means nothing is retrieved. Distances past L = {L} put the "
    "second copy past L as well."
)
PASSKEY_CAPTION = "Accuracy over every seed's prompts with its Wilson 95% interval."
TASKS_INTRO = (
    "The task models (Setup) trained at L = {task_length} bytes. **Copy**: a string of random lowercase letters, "
    "'|', the string again; at E bytes the strings have more than (E − 1) / 4 and at most (E − 1) / 2 letters, "
    "so from 2L on every string is longer than any in training; scored: the copied letters (chance "
    "{copy_chance:.1%}). **Recall**: random letters a–p in which {task_pairs} uppercase keys are each followed by "
    "a value in the first half and asked again in the second half; scored: the byte after each repeated key "
    "(chance {recall_chance:.2%}); at E the keys are up to E apart. Accuracy per answer byte (teacher forcing, "
    "top-1), every seed's rows pooled, with its Wilson 95% interval (the bytes of one row are not independent, so "
    "the interval is narrower than the seed-to-seed spread can be); exact match: rows with every answer right."
)
TASKS_NOT_LEARNED = (
    "Not learned within L (below {threshold:.0%} per byte at {task_length} bytes): {which}. Their accuracies past "
    "L say nothing about extrapolation, and the comparisons with the papers leave them out."
)

# Run-to-run spread --------------------------------------------------------------------------------

SPREAD_ONE_SEED = (
    "Every method was trained once (`--seeds 1`): the spread is unknown, and each comparison rests on one run."
)
SPREAD_INTRO = "Half the range of the loss over seeds {seeds} (nats), non-overlapping windows:"
SPREAD_EXPLAINED = (
    "A comparison between two methods is made on their per-seed differences (seed k against seed k: the same "
    "training batches), so each pair is held to its own spread: it agrees or disagrees only when every seed "
    "points the same way beyond the threshold, and is within run-to-run spread otherwise. With two seeds this is "
    "a weak test: two methods that are equal point the same way in both seeds half the time, so the threshold "
    "(2%) and the size of the difference carry much of the weight."
)

# the published findings ---------------------------------------------------------------------------

CLAIMS_WITHHELD = "**Verdicts withheld.** {warning}"
CLAIMS_NOTE = (
    "The papers trained far larger models on far more text (and the NoPE study used synthetic tasks, not language "
    "modelling); a verdict says whether this run's numbers point the same way, at this scale. **not measured** "
    "means the run lacks what the claim needs."
)
CLAIMS_TASKS_NOTE = (
    " The claims on copying and recall (Gu & Dao, Kazemnejad et al., Jelassi et al.) are checked on the task "
    "models, and only on those that learned their task within L (at least 50% per answer at their training "
    "length); the others' items are **withheld**."
)

# the base study -----------------------------------------------------------------------------------

BASE_INTRO = (
    "Pair i of a head of width d = {d} rotates by base^(−2i/d) per token, a period of 2π·base^(2i/d) tokens. "
    'Liu et al. ("Scaling Laws of RoPE-based Extrapolation") count the dimensions whose pairs complete a period '
    "within the training length, the critical dimension d_extra = 2·ceil((d/2)·log_base(L/2π)); the next pair is "
    "the first whose period exceeds L, and its period T_extra = 2π·base^(d_extra/d) is their extrapolation "
    "bound. Below base (L/2π)^(d/(d−2)) = {critical:.1f} every pair completes a period within L = {L}."
)
BASE_RISE = (
    '"Rise observed at": per seed, the first position at or past L/2 where two consecutive bins of {bin} '
    "positions lie more than {rise} nats above the mean loss of [L/2, L) on the {longest}-token windows; "
    '"none": no rise up to there.'
)
BASE_BEST = "Best at L: {at_L}. Best at {factor:g}L: {at_longest}."
BASE_ROFORMER_TABLE = (
    "A table of bases 100, 1,000, 10,000 and 100,000 circulates with write-ups of RoFormer as that paper's "
    'ablation. It is not in the RoFormer paper ("RoFormer: Enhanced Transformer with Rotary Position Embedding") '
    "and could not be verified, so it is not compared with here; the table above measures those bases."
)

# the transfer study -------------------------------------------------------------------------------

TRANSFER_CURVE = (
    "The transferred model's curve starts where the sinusoidal model it came from stopped; the RoPE and "
    "sinusoidal models trained for the whole budget are beside it."
)
TRANSFER_QUESTIONS = (
    "No paper we cite measures this transfer, so the questions below are this study's own, checked the same way "
    "as the papers' claims of the main comparison."
)

# Notes and Wall time ------------------------------------------------------------------------------

SCALING_NOTES = [
    "- Dynamic NTK is transformers' `dynamic` rope_type with factor E / L: at n tokens it raises RoPE's base as "
    "static NTK with alpha = factor·n/L − (factor − 1) would, i.e. alpha = factor² − factor + 1 at n = E (static "
    "NTK uses alpha = factor). Keys cached during decoding keep the frequencies they were rotated with.",
    "- YaRN uses beta_fast = 32, beta_slow = 1 and the attention temperature 0.1·ln(factor) + 1.",
    "- A fine-tuned scaling keeps its factor (extension length / L) at every evaluation length, as a model "
    "extended that way would be used; past the extension length it extrapolates again.",
]
BUDGET_NOTE = "- Budget: {note}"
WALL_TIME_NOTE = "- Wall time: {phases} (each model under Wall time; every phase in results.json){parallel}"
WALL_TIME_PARALLEL = (
    "; the models' phases are summed over the models, which took {seconds:.0f} s of wall time {jobs} at a time."
)

#: what a preset trades for its budget, said in its reports
BUDGET_NOTES = {
    "default": (
        "the default preset is what `make demo` runs within 10 minutes on 2 CPU cores. To train every method with "
        "two seeds, fine-tune four scalings, train RoPE at 4L and train a task model per encoding and seed, it "
        "trains each text model 480 steps where a single seed had 1,200, evaluates 16,384 bytes in non-overlapping "
        "windows (32,768 before) and 4,096 in sliding windows, fine-tunes for 48 steps (10% of pretraining), and "
        "trains the task models 1,000 steps at 32 bytes, width 64, for the first seed only (both seeds would take "
        "the run past 10 minutes; `--task-seeds 2` adds the second). Passkey retrieval and the retrieval probe on "
        "text, which no model of this size learned (0% and a gain of 0.00 for every method in every earlier run), "
        "are left to the large preset (`--passkey-trials 40 --retrieval-trials 16` restore them here); the copy "
        "and recall tasks measure retrieval instead. Two seeds make a weak test of each difference (see Run-to-run "
        "spread)."
    ),
    "large": (
        "the large preset is sized for one GPU within 20 minutes (docs/experiment.md, Presets, has the "
        "arithmetic): two seeds of every method at 1,500 steps of 32 × 512 tokens (24.6 M tokens per model, a "
        "quarter of the first form's 6,000 steps and a third fewer seeds), fine-tunes of 75 steps (5%), bf16 "
        "autocast and a compiled training step; the Wall time table says what the run took."
    ),
}

TIMING_HEADER = [
    "| model | steps | train (s) | ms / step | compiled (first 2 steps, s) | evaluate (s) |",
    "| --- | ---: | ---: | ---: | --- | ---: |",
]
TIMING_ROW = "| {name} | {steps} | {train} | {per_step} | {compiled} | {evaluate} |"
TIMING_TOTAL = (
    "Total {wall:.0f} s: {spent} (loading the text, the report). A model resumed from a checkpoint counts the "
    "time of its earlier sessions."
)
SPENT_PARALLEL = (
    "the models took {seconds:.0f} s, {jobs} at a time (each in a process of its own on {threads} torch "
    "thread(s)): training {train:.0f} s and evaluation {evaluate:.0f} s summed over them; the rest {rest:.0f} s"
)
SPENT_SERIAL = "training {train:.0f} s, evaluation {evaluate:.0f} s, the rest {rest:.0f} s"

# What this run shows ------------------------------------------------------------------------------

MODE_NAMES = {"windows": "non-overlapping windows", "sliding": "sliding windows"}
OBSERVED_RANGE = (
    "At {length} tokens ({factor:g}L), {mode}: the lowest perplexity is {lowest}'s, {lowest_value}; the highest "
    "{highest}'s, {highest_value}."
)
OBSERVED_GROWTH = "{label}: perplexity at {factor:g}L is {ratios} its value at L."
OBSERVED_GROWTH_RATIO = "{ratio:.2f}x with {mode}"
OBSERVED_POSITIONS = (
    "On {longest}-token windows, the loss at positions [{start}, {end}) minus the loss at [0, {L}) (nats): {deltas}."
)
OBSERVED_NO_RETRIEVAL = (
    "No method retrieves the planted span at any distance, inside L or past it: the largest mean retrieval gain "
    "is {gain:.2f} nats per byte ({label} at distance {distance}), against up to 4.1 for a model that copies: at "
    "this budget the probe, like passkey retrieval, finds nothing to rank."
)
OBSERVED_RETRIEVAL = "Retrieval gain (nats per byte), mean over the distances up to L / past L: {gains}."
OBSERVED_EXTENSION = (
    "At the extension length {E} ({mode}), against RoPE trained from scratch there ({scratch}): {ratios}."
)
OBSERVED_TASK = "{name} at {length} bytes ({factor:g}L of the task models), accuracy per byte: {accuracies}."
OBSERVED_PASSKEY = "Passkey retrieval at {length} tokens: best {best:.0%} ({leaders}{more})."
