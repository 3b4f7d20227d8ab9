"""A stand-in for serving, run as its own process: ``python -m tests.faults.standin PORT [DELAY_S] [fail]``.

It answers ``POST /infer-pipeline/infer`` as serving does (model, alias, version, run id, a prediction; a
504 ``deadline_exceeded`` for a job whose deadline has passed) after ``DELAY_S`` seconds, and ``GET /readyz``.
With ``fail`` every prediction is a 500 ``inference_failed`` (the model raised): what the retrain trigger counts.
Its start costs a second where the real serving's costs tens (MLflow, the predict pool), so the short
scenarios, which fault the bus, Redis and the bridges, put it behind the bridges; the real serving is
faulted in ``test_process_faults`` (long runs), ``test_model_faults`` and ``test_overload_faults``. Being a
process, it can be SIGKILLed and restarted.
"""

from __future__ import annotations

import asyncio
import sys
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def app(delay_s: float, *, fail: bool = False) -> FastAPI:
    api = FastAPI()

    @api.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    @api.post("/infer-pipeline/infer")
    async def infer(request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("deadline") is not None and body["deadline"] < time.time():
            return JSONResponse(
                {"error": "deadline passed", "prediction": 0.0, "code": "deadline_exceeded"}, status_code=504
            )
        await asyncio.sleep(delay_s)
        if fail:
            failed = {"error": "the model raised", "code": "inference_failed", "inference_failed": True}
            return JSONResponse(failed | {"prediction": 0.0, "job_id": body["job_id"]}, status_code=500)
        reply = {"model": body["model"], "alias": body.get("alias") or "Production", "version": "1"}
        return JSONResponse(reply | {"run_id": "run-1", "prediction": 0.5, "error": None, "job_id": body["job_id"]})

    return api


if __name__ == "__main__":
    port, delay = int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    uvicorn.run(app(delay, fail="fail" in sys.argv[3:]), host="127.0.0.1", port=port, log_level="warning")
