"""Multi-turn learning: the loop trains the tokens the policy sampled after an observation, in both ways an
episode's tokens are laid out (issue 37: "check the loop end to end before tuning").

The CI learning test (tests/test_e2e.py) and tests/workers/rl/test_learning.py score a single reply. Every recipe
is multi-turn: search, coding and the swarm sample a reply, read a tool's observation, and reply again, and the
learner must train each reply's sampled tokens, in the context the engine sampled them in, and nothing the
environment wrote. A mask shifted by the observation, tokens re-encoded between turns, or the wrong segment's
context would leave a single-turn test green and a recipe flat.

The task here: a two-turn "relay". The policy replies once, the environment answers with a tool message that
quotes the reply, and only the second reply is scored (it must be "blue", by the reward config's
`normalized_match`). The first reply is uncorrelated with the reward, so the reward can rise only if the second
reply's sampled tokens carry the episode's advantage. Two layouts are checked:
- appended: the observation's tokens are appended after the first reply (every tool environment);
- rewritten: the environment rewrites an earlier message (as search's `prune_chunks` does), so the second turn
  is a new segment whose prompt is the re-encoded conversation.
Besides the reward, the engine's log-probabilities of the sampled tokens must equal the learner's recomputation
before any update (the step's `mismatch/` figures): the test fails if sampling and training see other contexts.
"""

from __future__ import annotations

import statistics
from typing import Any, ClassVar

import pytest

from tests.learning_task import ANSWER, COLOURS, shaped_tiny_model
from workers.envs.base import Environment, Observation, StepResult
from workers.envs.registry import ENVIRONMENTS
from workers.models import make_backend
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.rollout import RolloutWorker
from workers.rl.weightsync import WeightSyncReceiver

STEPS = 6
PROMPTS, GROUP = 4, 8


class RelayEnv(Environment):
    """Two replies: the first is quoted back in a tool message, the second is the answer. With `rewrite`, the
    environment also rewrites the user's message after the first reply (`view_changed`), as a prune does."""

    name: ClassVar[str] = "relay_test"
    description: ClassVar[str] = "Test only: reply, read the quote of your reply, reply again (the answer)."

    def __init__(self, *, rewrite: bool = False) -> None:
        super().__init__(max_turns=2)
        self.rewrite = rewrite
        self._view_changed = False

    @property
    def view_changed(self) -> bool:
        return self._view_changed

    @property
    def messages(self) -> list[Any]:
        return list(self._messages)

    def step(self, action_text: str) -> StepResult:
        self._begin_step(action_text)
        self._turns.append({"role": "assistant", "content": action_text})
        if self._steps == 2:
            self._finish(answer=action_text.strip())
            return StepResult(None, True, self._info())
        quote = {"role": "tool", "content": f"You said {action_text.strip()!r}. Now give the colour of the sky."}
        self._messages.append(quote)
        self._turns.append(dict(quote))
        self._view_changed = self.rewrite
        if self.rewrite:  # shorten the first message, as a prune removes passages from the view
            first = self._messages[0]
            self._messages[0] = {"role": first["role"], "content": first["content"].split(".")[0] + "."}
        return StepResult(Observation([quote]), False, self._info())


@pytest.fixture(scope="module")
def relay_model(tmp_path_factory):  # type: ignore[no-untyped-def]
    return shaped_tiny_model(tmp_path_factory.mktemp("relay-model"))


@pytest.fixture
def relay_env():  # type: ignore[no-untyped-def]
    ENVIRONMENTS[RelayEnv.name] = RelayEnv
    yield RelayEnv.name
    del ENVIRONMENTS[RelayEnv.name]


def _tasks(n: int) -> list[dict[str, Any]]:
    return [
        {"id": f"relay-{i}", "prompt": f"Say any colour. Reply with one word (question {i}).", "answer": ANSWER}
        for i in range(n)
    ]


def _train(path, env: str, *, rewrite: bool, learning_rate: float) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    config = TrainConfig(
        base_model=str(path),
        environment=env,
        env_params={"rewrite": rewrite},
        algorithm="grpo",
        learning_rate=learning_rate,
        steps=STEPS,
        prompts_per_step=PROMPTS,
        group_size=GROUP,
        loss={"kl_coef": 0.0},
        sampling={"max_new_tokens": 1},  # type: ignore[arg-type]
        seed=5,
    )
    backend = make_backend("transformers", path)
    rollouts = RolloutWorker(
        backend,
        environment=env,
        env_params={"rewrite": rewrite},
        reward={"terms": [{"type": "normalized_match"}]},
        max_new_tokens=1,
    )
    learner = Learner(path, config)
    receiver = WeightSyncReceiver()
    tasks = _tasks(PROMPTS * STEPS)
    figures: dict[str, Any] = {"reward": [], "first_blue": [], "mismatch": [], "turns": set(), "segments": set()}
    for step in range(STEPS):
        result = rollouts.rollout(tasks[step * PROMPTS : (step + 1) * PROMPTS], group_size=GROUP, seed=step)
        firsts = []
        for sample in result.samples:
            assert not sample.provenance_mismatch, "trained ids differ from the engine's"
            assert sample.sampled_tokens == 2, sample.trajectory
            first_reply = sample.trajectory["turns"][1]["content"].strip()
            firsts.append(first_reply == ANSWER)
            figures["turns"].add(sample.num_turns)
            figures["segments"].add(len(sample.segments))
        metrics = learner.train_step(result.samples)
        figures["reward"].append(statistics.mean(s.reward for s in result.samples))
        figures["first_blue"].append(statistics.mean(firsts))
        figures["mismatch"].append(metrics.get("mismatch/abs_logprob_diff_max", float("nan")))
        blob, _ = learner.weight_update()
        if blob is not None:
            backend.load_state_dict(receiver.receive(blob), learner.version)
    return figures


@pytest.mark.parametrize("rewrite", [False, True], ids=["appended", "rewritten"])
def test_the_reply_after_an_observation_learns_and_sampling_matches_training(relay_model, relay_env, rewrite):
    figures = _train(relay_model, relay_env, rewrite=rewrite, learning_rate=0.05)
    assert figures["turns"] == {2}
    assert figures["segments"] == ({2} if rewrite else {1})
    # Sampling and training score the same tokens in the same contexts: before any update the learner's
    # log-probabilities of the sampled tokens equal the engine's (float32 on both sides).
    assert max(figures["mismatch"]) < 1e-3, figures["mismatch"]
    rewards = figures["reward"]
    assert rewards[0] > 0.05, rewards  # "blue" is sampled from the start (about 1 in 4 of the shaped colours)
    first, last = statistics.mean(rewards[:2]), statistics.mean(rewards[-2:])
    # Margin: a 2-step mean of 64 one-or-zero rewards near 0.25 has a standard deviation of about 0.05. Measured
    # (docs/learning-checks.md): 0.28 -> 1.00 by step 3 in both layouts; learning rate 0 stays within 0.09-0.31.
    assert last - first > 0.3, figures


def test_nothing_rises_with_a_learning_rate_of_zero(relay_model, relay_env):
    figures = _train(relay_model, relay_env, rewrite=False, learning_rate=0.0)
    rewards = figures["reward"]
    assert abs(statistics.mean(rewards[-2:]) - statistics.mean(rewards[:2])) < 0.2, figures


def test_the_relay_colours_are_single_tokens(relay_model):  # the test's premise: one sampled token is one word
    tokenizer = make_backend("transformers", relay_model).tokenizer
    assert all(len(tokenizer.encode(word, add_special_tokens=False)) == 1 for word in COLOURS)
