"""The MLflow side of bench/ingest_vs_mlflow.py; runs inside MLflow's own virtualenv.

    python _mlflow_client.py <tracking uri> <batched|batched_raw|single|read> '<json kwargs>'

Prints one JSON line with the figure.
"""

import json
import sys
import threading
import time

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient


def new_run(client):
    experiment = client.get_experiment_by_name("bench") or client.get_experiment(client.create_experiment("bench"))
    return client.create_run(experiment.experiment_id).info.run_id


def _timed(work, run_ids):
    """Seconds for one thread per run to run `work(run_id)`, all at once."""
    threads = [threading.Thread(target=work, args=(r,)) for r in run_ids]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def batched(client, clients, batches, size=1000):
    run_ids = [new_run(client) for _ in range(clients)]

    def work(run_id):
        now = int(time.time() * 1000)
        for b in range(batches):
            metrics = [Metric("loss", 0.5 + (i % 97) / 1000, now, b * size + i) for i in range(size)]
            client.log_batch(run_id, metrics=metrics)

    return {"points_per_s": clients * batches * size / _timed(work, run_ids)}


def batched_raw(client, clients, batches, size=1000):
    """The same batches as `batched`, each request body encoded before the clock starts and POSTed to the REST
    API's log-batch as it is: what the server does, without the client's work per batch."""
    import requests

    run_ids = [new_run(client) for _ in range(clients)]
    url = client._tracking_client.tracking_uri.rstrip("/") + "/api/2.0/mlflow/runs/log-batch"
    now = int(time.time() * 1000)
    bodies = {
        run_id: [
            json.dumps(
                {
                    "run_id": run_id,
                    "metrics": [
                        {"key": "loss", "value": 0.5 + (i % 97) / 1000, "timestamp": now, "step": b * size + i}
                        for i in range(size)
                    ],
                }
            ).encode()
            for b in range(batches)
        ]
        for run_id in run_ids
    }

    def work(run_id):
        with requests.Session() as http:
            for body in bodies[run_id]:
                response = http.post(url, data=body, headers={"Content-Type": "application/json"})
                response.raise_for_status()

    return {"points_per_s": clients * batches * size / _timed(work, run_ids)}


def single(client, count):
    run_id = new_run(client)
    started = time.perf_counter()
    for i in range(count):
        client.log_metric(run_id, "single", 0.5, step=i)
    return {"points_per_s": count / (time.perf_counter() - started)}


def read(client, points):
    run_id = new_run(client)
    now = int(time.time() * 1000)
    for b in range(0, points, 1000):
        client.log_batch(run_id, metrics=[Metric("loss", 0.5, now, b + i) for i in range(1000)])
    started = time.perf_counter()
    history = client.get_metric_history(run_id, "loss")
    elapsed = time.perf_counter() - started
    assert len(history) == points, len(history)
    return {"ms": elapsed * 1000}


if __name__ == "__main__":
    uri, mode, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    tracking = MlflowClient(tracking_uri=uri)
    modes = {"batched": batched, "batched_raw": batched_raw, "single": single, "read": read}
    print(json.dumps(modes[mode](tracking, **kwargs)))
