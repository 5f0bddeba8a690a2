"""spotwise.hpo in-process with real Optuna on SQLite: a trial interrupted by a notice or left
behind by a dead worker is continued -- same number, same params, earlier intermediate values
kept -- by the next worker from its spotwise.Run checkpoint; mismatched studies and unreachable
storage are refused with a clear error."""

from __future__ import annotations

import threading

import optuna
import pytest
import torch

from spotwise import CheckpointConfig, Run
from spotwise.errors import ConfigError, PlanMismatchError
from spotwise.hpo import TrialLeases, open_study, run_worker, study_sha256

SPACE = {"lr": optuna.distributions.FloatDistribution(0.01, 0.5, log=True)}
STEPS = 12


def _objective(stop_at: dict[int, int], seen: list[tuple[int, int, float]]):
    """Fits y = 3x with SGD through a spotwise.Run; exits 75 at step ``stop_at[number]`` (once),
    as a Run does after saving on a notice."""

    def objective(trial: optuna.Trial, run_dir: str) -> float:
        lr = trial.suggest_float("lr", 0.01, 0.5, log=True)
        torch.manual_seed(0)
        w = torch.nn.Linear(1, 1, bias=False)
        opt = torch.optim.SGD(w.parameters(), lr=lr)
        run = Run(run_dir, state={"model": w, "optimizer": opt}, steps=STEPS,
                  checkpoint=CheckpointConfig(every=1), notices=None)  # fmt: skip
        seen.append((trial.number, run.step, lr))
        x = torch.linspace(-1, 1, 16).unsqueeze(1)
        for step in run:
            loss = ((w(x) - 3 * x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            trial.report(loss.item(), step)
            if stop_at.get(trial.number) == step + 1:
                del stop_at[trial.number]
                run.save()
                run.close()
                raise SystemExit(75)
        return float(((w(x) - 3 * x) ** 2).mean().detach())

    return objective


def test_a_trial_stopped_by_a_notice_is_continued_by_the_next_worker(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = open_study(url, "s", "minimize", SPACE, trials=3, seed=1)
    seen: list[tuple[int, int, float]] = []
    with pytest.raises(SystemExit) as stop:
        run_worker(
            _objective({1: 5}, seen),
            study,
            url,
            run_root=str(tmp_path / "runs"),
            trials=3,
            holder="first",
        )
    assert stop.value.code == 75
    done = run_worker(
        _objective({}, seen), study, url, run_root=str(tmp_path / "runs"), trials=3, holder="second"
    )
    assert done.resumed == [1], "the handed-back trial was taken over at once"
    trials = study.get_trials()
    assert [(t.number, t.state.name) for t in trials] == [(i, "COMPLETE") for i in range(3)]
    [(_, start, lr_again)] = [s for s in seen if s[0] == 1 and s[1] > 0]
    first_lr = next(s[2] for s in seen if s[0] == 1 and s[1] == 0)
    assert start == 4 and lr_again == first_lr, "continued from its checkpoint, same params"
    assert sorted(trials[1].intermediate_values) == list(range(STEPS))
    assert [a["holder"] for a in trials[1].user_attrs["spotwise.attempts"]] == ["first", "second"]

    # the same study without interruptions gives the same result
    url2 = f"sqlite:///{tmp_path / 'u.db'}"
    plain = open_study(url2, "s", "minimize", SPACE, trials=3, seed=1)
    run_worker(_objective({}, []), plain, url2, run_root=str(tmp_path / "runs2"), trials=3)
    assert study_sha256(plain) == study_sha256(study)


def test_a_dead_workers_trial_is_taken_over_after_its_lease_expires(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = open_study(url, "s", "minimize", SPACE, trials=1, seed=2)
    orphan = study.ask()  # a worker started trial 0, leased it for 1 s, and died
    assert TrialLeases(url).take(orphan._trial_id, "dead", 1.0, new=True) is not None
    assert TrialLeases(url).take(orphan._trial_id, "other", 1.0) is None, "live: not taken"
    done = run_worker(
        _objective({}, []),
        study,
        url,
        run_root=str(tmp_path / "runs"),
        trials=1,
        holder="next",
        poll_s=0.1,
    )
    assert done.resumed == [0] and done.finished == [0]
    [t] = study.get_trials()
    assert t.state.name == "COMPLETE" and t.params == t.system_attrs["fixed_params"]


def test_a_study_with_another_direction_or_space_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    open_study(url, "s", "minimize", SPACE, trials=2, seed=0)
    with pytest.raises(PlanMismatchError, match="created to minimize"):
        open_study(url, "s", "maximize", SPACE, trials=2, seed=0)
    other = {"lr": optuna.distributions.FloatDistribution(0.001, 0.5, log=True)}
    with pytest.raises(PlanMismatchError, match=r"another search space .*lr"):
        open_study(url, "s", "minimize", other, trials=2, seed=0)
    assert len(optuna.load_study(study_name="s", storage=url).get_trials()) == 2


def test_unreachable_storage_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot reach the study storage"):
        open_study(f"sqlite:///{tmp_path}/missing/dir/s.db", "s", "minimize", SPACE)
    with pytest.raises(ConfigError, match="not a database URL"):
        open_study(str(tmp_path / "s.db"), "s", "minimize", SPACE)


@pytest.mark.parametrize("seed", [3, None])
def test_workers_starting_trials_at_once_make_exactly_the_trials_asked(tmp_path, seed):
    # a seeded study pops its enqueued trials, an unseeded one creates them: either way two
    # workers asking at the same moment once made one trial too many (a sweep of 8 ended with 9)
    url = f"sqlite:///{tmp_path / 's.db'}"
    open_study(url, "s", "minimize", SPACE, trials=4, seed=seed)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            study = optuna.load_study(study_name="s", storage=url)
            run_worker(lambda trial, _: trial.suggest_float("lr", 0.01, 0.5, log=True), study,
                       url, run_root=str(tmp_path / "runs"), trials=4, holder=f"w{n}",
                       poll_s=0.01)  # fmt: skip
        except BaseException as exc:  # reported from the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors and not any(t.is_alive() for t in threads), errors
    trials = optuna.load_study(study_name="s", storage=url).get_trials()
    assert [(t.number, t.state.name) for t in trials] == [(i, "COMPLETE") for i in range(4)]
