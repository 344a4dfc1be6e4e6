"""A standalone command's torch threads: the cores the load average leaves free, said in one line."""

from __future__ import annotations

import pytest
import torch

from recurlen.util import threads


@pytest.mark.parametrize(("cpus", "load", "want"), [
    (2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.4, 1), (2, 14.0, 1),  # a loaded 2-core machine: one thread
    (16, 3.2, 13), (16, 0.0, 16), (16, 40.0, 1), (1, 0.0, 1), (8, 7.5, 1), (8, 6.4, 2),
])
def test_threads_are_the_free_cores_rounded_at_least_one(cpus, load, want):
    assert threads.choose_threads(cpus, load) == want


@pytest.fixture
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_command_takes_the_free_cores_and_says_so(monkeypatch, keep_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    monkeypatch.setattr(threads, "load_average", lambda: 14.2)
    line = threads.set_threads(None, setting="num_threads")
    assert line == "torch threads: 1 (load average 14.2 on 2 cores leaves ~0.0 free; num_threads=N to choose)"
    assert torch.get_num_threads() == 1


def test_training_keeps_its_thread_count_and_says_which_would_suit(monkeypatch, keep_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    monkeypatch.setattr(threads, "load_average", lambda: 7.0)
    line = threads.set_threads(None, setting="trainer.num_threads", choose=False)
    assert torch.get_num_threads() == 2 and "trainer.num_threads=1 would run faster" in line, line
    assert threads.set_threads(3, setting="trainer.num_threads") == "torch threads: 3 (trainer.num_threads=3; 2 " \
                                                                    "cores here)"
    assert torch.get_num_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.set_threads(None, setting="num_threads").startswith("torch threads: 3 (OMP_NUM_THREADS=3;")


def test_a_busy_machine_makes_waiting_threads_sleep_unless_the_user_chose(monkeypatch):
    """OMP_WAIT_POLICY=PASSIVE at a load of one runnable process per core or more, before torch is imported; never
    over the user's own policy, never once torch (and its OpenMP) has started, never on a quiet machine."""
    import sys

    from recurlen.util import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    monkeypatch.delitem(sys.modules, "torch")  # as at the command's start; restored after the test
    for load, want in ((0.4, None), (1.9, None), (2.0, "PASSIVE"), (6.5, "PASSIVE")):
        monkeypatch.setattr(threads, "load_average", lambda load=load: load)
        env: dict[str, str] = {}
        assert threads.wait_passively_when_busy(env) == (want is not None)
        assert env.get("OMP_WAIT_POLICY") == want
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert not threads.wait_passively_when_busy(env) and env == {"OMP_WAIT_POLICY": "ACTIVE"}
    monkeypatch.setattr(threads, "load_average", lambda: None)  # a platform without a load average
    assert not threads.wait_passively_when_busy({})
    monkeypatch.setattr(threads, "load_average", lambda: 6.5)
    monkeypatch.setitem(sys.modules, "torch", object())  # too late: OpenMP has read its settings
    assert not threads.wait_passively_when_busy({})
