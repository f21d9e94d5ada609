"""Lines that may come once per job are summarised, not repeated."""

import logging

import pytest

from agora_pg.logs import Repeated


def test_the_first_line_of_a_window_is_logged_with_a_count_of_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    logger = logging.getLogger("test.repeated")
    repeated = Repeated(logger, logging.INFO, window=60, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="test.repeated"):
        for job_id in range(1000):
            now[0] = job_id * 0.1  # 1,000 lines over 100 s
            repeated.log("job %d: stopping it (%s)", job_id, "shutdown")
    said = [(record.levelno, record.getMessage()) for record in caplog.records if record.levelno > logging.DEBUG]
    assert said == [
        (logging.INFO, "job 0: stopping it (shutdown)"),
        (logging.INFO, "job 600: stopping it (shutdown) (and 599 more like it since the last such line, "
                       "logged at DEBUG)"),
    ]
    assert sum(record.levelno == logging.DEBUG for record in caplog.records) == 998  # nothing is lost
