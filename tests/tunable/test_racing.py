"""racing.still_open: which candidates' timed rounds go on after a complete round."""

from tunekit.tunable.racing import still_open

NO_FLOOR = lambda name: 0.0  # noqa: E731


def test_candidates_within_the_margin_of_the_leader_stay_and_a_clear_loser_goes():
    samples = {"ref": [1.0, 1.01, 0.99], "a": [0.50, 0.52, 0.51], "b": [0.515, 0.52, 0.50], "slow": [0.6, 0.58, 0.59]}
    assert still_open(samples, list(samples), "ref", 0.03, NO_FLOOR) == ["ref", "a", "b"]


def test_a_loser_with_one_round_near_the_leader_stays():
    samples = {"ref": [1.0, 1.0, 1.0], "a": [0.50, 0.50, 0.50], "noisy": [0.70, 0.515, 0.70]}
    assert still_open(samples, list(samples), "ref", 0.03, NO_FLOOR) == ["ref", "a", "noisy"]


def test_the_default_alone_or_a_clear_winner_over_it_settles_the_rounds():
    assert still_open({"ref": [1.0] * 3, "a": [1.5] * 3}, ["ref", "a"], "ref", 0.03, NO_FLOOR) == []
    assert still_open({"ref": [1.0, 1.1, 0.9], "a": [0.5, 0.6, 0.55]}, ["ref", "a"], "ref", 0.03, NO_FLOOR) == []


def test_a_winner_not_ahead_of_the_default_in_every_round_keeps_both_timed():
    samples = {"ref": [1.0, 0.98, 1.0], "a": [0.96, 0.97, 0.975]}  # round 2: 0.97 against 0.98
    assert still_open(samples, list(samples), "ref", 0.03, NO_FLOOR) == ["ref", "a"]


def test_the_default_is_never_dropped_however_slow():
    samples = {"ref": [3.0] * 3, "a": [1.0] * 3, "b": [1.01] * 3}
    assert still_open(samples, list(samples), "ref", 0.03, NO_FLOOR) == ["ref", "a", "b"]


def test_the_leader_is_the_fastest_that_saves_its_floor():
    samples = {"ref": [1.0] * 3, "costly": [0.5] * 3, "good": [0.6] * 3}
    floor = lambda name: 0.6 if name == "costly" else 0.0  # noqa: E731 - costly saves 0.5 < 0.6
    assert still_open(samples, list(samples), "ref", 0.03, floor) == ["ref", "costly", "good"]  # good stays
    assert still_open(samples, list(samples), "ref", 0.03, NO_FLOOR) == []  # good goes; costly settles it
