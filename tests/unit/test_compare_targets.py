from benchmarks.compare.report import targets_table


def test_each_target_is_a_ratio_to_its_limit_in_the_same_run() -> None:
    results = {
        "systems": {
            "agora": {"enqueue_one_per_s": 2600.0, "plain_insert_per_s": 3700.0, "enqueue_batch_per_s": 66000.0,
                      "drain_1p": 20000.0, "work": {"server_cpu_us": 30.0},
                      "work_low_concurrency": {"server_cpu_us": 75.0}},
            "pgqueuer": {"enqueue_one_per_s": 2000.0, "enqueue_batch_per_s": 55000.0, "drain_1p": 10000.0},
        },
        "raw": {"claim_100_ordered_1c": 40000.0},
    }
    table = "\n".join(targets_table(results))
    assert "| enqueue one at a time vs PgQueuer | 1.30x | ≥ 1.20x | yes |" in table
    assert "| enqueue one at a time vs a bare asyncpg insert, same columns | 0.70x | ≥ 0.90x | no |" in table
    assert "| batch enqueue vs PgQueuer | 1.20x | ≥ 1.50x | no |" in table
    assert "| drain, 1 process, vs pgbench claim+complete 100 in claim order, 1 client | 0.50x | ≥ 0.75x | no |" in table
    assert "| drain, 1 process, vs PgQueuer | 2.00x | ≥ 2.50x | no |" in table
    assert "| server CPU per job, concurrency 10 vs 500 | 2.50x | ≤ 2.00x | no |" in table


def test_a_ceiling_is_met_at_or_below_it() -> None:
    results = {"systems": {"agora": {"work": {"server_cpu_us": 30.0}, "work_low_concurrency": {"server_cpu_us": 45.0}}}}
    assert "| server CPU per job, concurrency 10 vs 500 | 1.50x | ≤ 2.00x | yes |" in "\n".join(targets_table(results))


def test_a_target_whose_limit_was_not_measured_is_left_out() -> None:
    results = {"systems": {"agora": {"enqueue_one_per_s": 2600.0}}}
    assert targets_table(results) == []
