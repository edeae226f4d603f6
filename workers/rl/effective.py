"""A run's effective settings: its algorithm's method defaults (`workers.rl.algorithms`) merged with the run's
overrides, every setting with its origin, and the departures from the method's source, for the learner, the
trainer and the run page. Torch-free, like the defaults it merges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workers.envs.registry import make_env
from workers.rl.algorithms import (
    CONSTANT_NORMALISER,
    DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS,
    KL_PLACEMENT_OF,
    LOSS_OVERRIDES,
    METHOD_DEFAULTS,
    OVERLONG_CACHE_FRACTION,
    AdvantageScale,
    Algorithm,
    KLEstimator,
    LossConfig,
    SettingsError,
    loss_config,
)

if TYPE_CHECKING:
    from workers.rl.config import TrainConfig


@dataclass(frozen=True)
class SettingRow:
    """One line of the run page's effective settings: `overridden` when the run set it, else the method's."""

    name: str
    value: str
    overridden: bool
    source: str


@dataclass(frozen=True)
class EffectiveSettings:
    """Everything the learner and the trainer do differently per algorithm, after a run's overrides.

    Attributes:
        scale_rewards: ``"group"`` divides advantages by the group std, ``"none"`` does not.
        drop_equal_groups: skip groups whose (shaped) rewards are all equal: their advantages are exactly 0.
        dynamic_sampling: DAPO's over-sample, filter, refill (P3), on the task reward, before the learner.
        dynamic_sampling_max_rounds: generation rounds per step (the first included) to fill the batch.
        overlong_penalty: add DAPO's R_length (eq. 13) to the reward.
        overlong_max_tokens, overlong_cache_tokens: its L_max and L_cache, in sampled tokens per episode.
        episode_token_limit: the most tokens the policy can sample in one episode (max_new_tokens × max_turns).
        loss: the policy loss and its KL.
        loss_source: where the loss defaults come from (`LossConfig.source`), for the run page.
        rows: every setting with its value and origin, for the run page.
        notes: departures from the method's source, for the run page.
    """

    algorithm: Algorithm
    scale_rewards: AdvantageScale
    drop_equal_groups: bool
    dynamic_sampling: bool
    dynamic_sampling_max_rounds: int
    overlong_penalty: bool
    overlong_max_tokens: int
    overlong_cache_tokens: int
    episode_token_limit: int
    loss: LossConfig
    loss_source: str = ""
    rows: tuple[SettingRow, ...] = ()
    notes: tuple[str, ...] = ()


def environment_max_turns(environment: str, env_params: dict[str, Any]) -> int | None:
    """The environment's limit on policy replies per episode (None when it cannot be built: the environment check
    reports why)."""

    try:
        return int(make_env(environment, **env_params).max_turns)
    except (ValueError, TypeError):
        return None


def episode_token_limit(config: TrainConfig, max_turns: int | None = None) -> int:
    """The most tokens the policy can sample in one episode: every turn samples at most `max_new_tokens` and an
    episode has at most the environment's `max_turns` replies. Observation tokens between turns are not sampled
    (their loss mask is 0), so they do not count, however long a search result is."""
    turns = max_turns if max_turns is not None else environment_max_turns(config.environment, config.env_params)
    return config.sampling.max_new_tokens * max(turns or 1, 1)


def _loss_and_mismatch(
    config: TrainConfig, loss: LossConfig, limit: int, rows: list[SettingRow], notes: list[str]
) -> LossConfig:
    """The loss's and the mismatch correction's rows and notes (appended to `rows` and `notes`); returns the
    method's own loss (its defaults), against which an override is marked."""
    algorithm: Algorithm = config.algorithm
    base = LossConfig.defaults(algorithm, max_completion_length=limit)
    for name in LOSS_OVERRIDES:
        if name == "cispo_mask" and algorithm != "cispo":
            continue
        if name == "tau" and algorithm != "kimi":
            continue
        if name in ("kl_estimator", "kl_placement") and loss.kl_coef == 0:
            continue
        value = getattr(loss, name)
        source = _placement_source(loss.kl_estimator) if name == "kl_placement" else LOSS_SETTING_MEANING[name]
        rows.append(SettingRow(f"loss.{name}", _show(value), value != getattr(base, name), source))
    if algorithm in CONSTANT_NORMALISER:
        rows.append(
            SettingRow(
                "loss.max_completion_length",
                str(limit),
                False,
                "Dr. GRPO's constant normaliser: the most tokens the policy can sample in one episode "
                "(max_new_tokens × the environment's max_turns)",
            )
        )
    mismatch = config.mismatch
    rows.append(
        SettingRow(
            "mismatch.correction",
            mismatch.correction,
            mismatch.correction != "none",
            "Train-inference mismatch (docs/methods.md P7), measured every step under mismatch/: none, or an "
            "importance weight on each token's policy-gradient term (tis min(r, C), mis r or 0 above C; seq_* on the "
            "sequence's geometric mean), π_old then recomputed by the learner. Off by default: on CPU the engine "
            "and the learner both compute in fp32",
        )
    )
    if mismatch.correction != "none" or mismatch.cap != 2.0:
        rows.append(
            SettingRow("mismatch.cap", _show(mismatch.cap), mismatch.cap != 2.0, "C; 2 is the common choice (P7)")
        )
    if loss.kl_coef > 0 and loss.kl_placement == "reward" and loss.kl_estimator != "k1":
        notes.append(
            f"kl_estimator={loss.kl_estimator!r} as a reward penalty is biased: its policy gradient misses the "
            "estimator's own gradient (k1 is the unbiased one in the reward)."
        )
    return base


def effective_settings(config: TrainConfig, *, max_turns: int | None = None) -> EffectiveSettings:
    """`config.algorithm`'s method defaults merged with the run's overrides (a field left unset, None, is the
    method's). Raises `SettingsError` naming the field for a combination that cannot work."""
    # One function on purpose: each setting's default depends on the ones picked before it (drop on dynamic sampling,
    # the cache on the overlong penalty), in the order the rows are shown; the loss's and the mismatch rows are in
    # _loss_and_mismatch.
    algorithm: Algorithm = config.algorithm
    method = METHOD_DEFAULTS[algorithm]
    limit = episode_token_limit(config, max_turns)
    try:
        loss = loss_config(algorithm, dict(config.loss), max_completion_length=limit)
    except ValueError as exc:
        raise SettingsError("loss", str(exc)) from None

    rows: list[SettingRow] = []
    notes: list[str] = []

    def pick(name: str, value: Any, default: Any, source: str) -> Any:
        chosen = default if value is None else value
        rows.append(SettingRow(name, _show(chosen), value is not None and value != default, source))
        return chosen

    scale = pick("scale_rewards", config.scale_rewards, method.scale_rewards, method.scale_source())
    if scale != method.scale_rewards:
        verb = "divides" if method.scale_rewards == "group" else "does not divide"
        notes.append(f"scale_rewards={scale!r}: {algorithm}'s source {verb} advantages by the group std.")
    dynamic = pick("dynamic_sampling", config.dynamic_sampling, method.dynamic_sampling, method.dynamic_source())
    if dynamic:
        pick(
            "dynamic_sampling_max_rounds",
            config.dynamic_sampling_max_rounds,
            DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS,
            "Generation rounds per step, the first included (ours: DAPO refills until the batch is full); a step "
            "whose batch is still short trains on what it has and says so in its metrics",
        )
    if algorithm == "dapo" and not dynamic:
        notes.append(
            "dynamic_sampling is off: DAPO (P3) over-samples and refills the batch with groups that have signal."
        )
    # A group whose rewards are all equal still has a loss term when the KL or Kimi's τ term is in the loss.
    drop_default = True if (dynamic or method.drops_equal_groups) else not (loss.kl_in_loss or loss.tau > 0)
    drop_source = "Groups whose rewards are all equal have advantage 0: " + (
        "the method leaves them out"
        if method.drops_equal_groups
        else "skipping them changes no gradient (the normaliser still counts them) unless the KL is in the loss"
    )
    drop = pick("drop_equal_groups", config.drop_equal_groups, drop_default, drop_source)
    if dynamic and not drop:
        raise SettingsError(
            "drop_equal_groups",
            "dynamic_sampling filters out groups whose rewards are all equal and refills the batch, so "
            "drop_equal_groups cannot be false with it: unset drop_equal_groups, or set dynamic_sampling to false",
        )
    if drop and loss.kl_in_loss and not method.drops_equal_groups:
        notes.append(
            "drop_equal_groups with the KL in the loss: the skipped groups lose their KL term, which "
            f"{algorithm}'s source applies to every sequence."
        )
    overlong = pick("overlong_penalty", config.overlong_penalty, method.overlong_penalty, method.overlong_source())
    cache_default = max(1, round(limit * OVERLONG_CACHE_FRACTION))
    cache = cache_default
    if overlong:
        rows.append(
            SettingRow(
                "overlong_max_tokens",
                str(limit),
                False,
                "L_max: the most tokens the policy can sample in one episode (max_new_tokens × the environment's "
                "max_turns)",
            )
        )
        cache = pick(
            "overlong_cache_tokens",
            config.overlong_cache_tokens,
            cache_default,
            "L_cache: DAPO used 4,096 of 20,480 tokens, a fifth of L_max",
        )
        if cache > limit:
            raise SettingsError(
                "overlong_cache_tokens",
                f"overlong_cache_tokens={cache} is more than L_max={limit} (max_new_tokens × max_turns): "
                f"set it to at most {limit}",
            )
    if overlong and not method.overlong_penalty:
        notes.append(f"overlong_penalty is on: {algorithm}'s source has no length penalty.")
    if algorithm == "dapo" and not overlong:
        notes.append("overlong_penalty is off: DAPO (P3) adds the soft overlong penalty of eq. 13 to the reward.")

    base = _loss_and_mismatch(config, loss, limit, rows, notes)
    return EffectiveSettings(
        algorithm=algorithm,
        scale_rewards=scale,
        drop_equal_groups=drop,
        dynamic_sampling=dynamic,
        dynamic_sampling_max_rounds=config.dynamic_sampling_max_rounds or DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS,
        overlong_penalty=overlong,
        overlong_max_tokens=limit,
        overlong_cache_tokens=cache,
        episode_token_limit=limit,
        loss=loss,
        loss_source=base.source,
        rows=tuple(rows),
        notes=tuple(notes),
    )


LOSS_SETTING_MEANING: dict[str, str] = {
    "epsilon_low": "The ratio's clip floor is 1 − epsilon_low (CISPO: of the importance weight; >= 1: none; kimi: "
    "the log-ratio's floor is −epsilon_low)",
    "epsilon_high": "The ratio's clip ceiling is 1 + epsilon_high (kimi: the log-ratio's ceiling is epsilon_high)",
    "kl_coef": "β, the weight of the KL to the reference policy (0: no KL, no reference copy)",
    "kl_estimator": "docs/methods.md P6: k1 = log π_θ − log π_ref, k2 = ½ (log r)², k3 = r − 1 − log r",
    "cispo_mask": "P4's unified mask: also drop the tokens PPO's clip would have zeroed",
    "tau": "K3: weight of the quadratic term τ·(log π_θ/π_old)² (kimi only)",
}


def _placement_source(estimator: KLEstimator) -> str:
    return (
        f"{estimator}'s placement is the {KL_PLACEMENT_OF[estimator]}: k1 regularises only as a reward penalty, "
        "k2 and k3 in the loss (workers/rl/CONVENTIONS.md)"
    )


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
