"""A driver killed mid-stream (SIGKILL of the whole Spark process tree) resumes without loss."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from collections import Counter

import pytest

from tests.spark.conftest import BOUNDED_WAIT_SECONDS, REPO_ROOT, start_driver

pytestmark = pytest.mark.spark

PIPELINE = REPO_ROOT / "examples" / "pipeline.py"


def load_pipeline():
    spec = importlib.util.spec_from_file_location("example_pipeline", PIPELINE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Its own waits are its bounds: up to 120 s for the driver's first batches, then BOUNDED_WAIT_SECONDS for the
# query that resumes; and the Spark session this test may be the first to ask for starts outside them
@pytest.mark.timeout(120 + BOUNDED_WAIT_SECONDS + 30, func_only=True)
def test_killed_driver_resumes_from_checkpoint_without_loss(spark, broker, amqp, unique, tmp_path):
    pipeline = load_pipeline()
    source, target = f"{unique}-orders", f"{unique}-enriched"
    orders = 2000
    pipeline.declare_and_seed(broker.url, source, target, orders)
    arguments = ["--uri", broker.url, "--source", source, "--target", target, "--checkpoint", str(tmp_path / "checkpoint")]

    driver = start_driver([str(PIPELINE), *arguments, "--max-per-batch", "100", "--continuous"], tmp_path / "driver")
    try:
        amqp.wait_until(lambda: amqp.counts(target)[0] >= 300 or driver.poll() is not None, timeout=120)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, its JVM and Spark's Python workers
        driver.wait()
    assert driver.returncode == -signal.SIGKILL, "the driver ended before it was killed"
    assert amqp.wait_for_no_consumer(source) > 0, "the driver was meant to die mid-stream"

    query = pipeline.start_pipeline(spark, pipeline.parse_args(arguments))  # Trigger.AvailableNow
    assert query.awaitTermination(BOUNDED_WAIT_SECONDS)

    published = [(json.loads(body)["id"], properties.headers["redelivered"]) for _, properties, body in amqp.drain(target)]
    ids = [order_id for order_id, _ in published]
    assert set(ids) == set(range(orders)), "an order was lost"
    duplicated = {order_id for order_id, count in Counter(ids).items() if count > 1}
    flagged = {order_id for order_id, redelivered in published if redelivered == "true"}
    assert duplicated <= flagged, "a duplicate was not flagged redelivered"
    assert amqp.wait_for_no_consumer(source) == 0
