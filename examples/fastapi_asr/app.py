"""Speech to tokens over HTTP, on Ferry: POST /asr with a WAV file.

    FERRY_FRONTEND=tcp://127.0.0.1:5555 FERRY_REDIS=redis://127.0.0.1:6379 \
        python3 -m uvicorn app:app --port 8000
    curl -F file=@hello.wav http://127.0.0.1:8000/asr

The handler turns the upload into 16 kHz mono int16 PCM (stdlib wave + numpy) and awaits
ferry.AsyncClient.run on the model `whisper` (forward(pcm [B, L] int16) -> [B, T] int64 token
ids). Every request awaits on one client and one socket: the requests that arrive together go
to the broker as one SUBMIT, and the worker runs them as one batch. See README.md.
"""

import io
import os
import wave

import numpy as np
from fastapi import FastAPI, File, HTTPException, UploadFile

import ferry

RATE = 16000                       # Whisper's sample rate
MAX_SECONDS = 30                   # Whisper's window: split longer audio before sending
END_OF_TEXT = 50257                # ids from here on are special tokens
MODEL = os.environ.get("ASR_MODEL", "whisper")
TIMEOUT_S = float(os.environ.get("ASR_TIMEOUT_S", "60"))

app = FastAPI(title="Ferry ASR example")
client = None  # one ferry.AsyncClient per process, made on the server's event loop


@app.on_event("startup")
async def startup():
    global client
    client = ferry.AsyncClient()  # FERRY_FRONTEND / FERRY_REDIS


@app.on_event("shutdown")
async def shutdown():
    await client.close()


def wav_to_pcm16k(data):
    """A PCM WAV file's bytes -> int16 mono samples at 16 kHz (numpy). ValueError if the file
    is not uncompressed PCM. Channels are averaged; other rates are resampled with an FFT
    (band-limited: what scipy.signal.resample does)."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as e:
        raise ValueError("not a PCM WAV file (%s)" % (str(e) or type(e).__name__))
    if width == 1:
        x = (np.frombuffer(frames, np.uint8).astype(np.float64) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(frames, "<i2") / 32768.0
    elif width == 3:
        b = np.frombuffer(frames, np.uint8).reshape(-1, 3)
        x = ((b[:, 0].astype(np.int32) | (b[:, 1].astype(np.int32) << 8)
              | (b[:, 2].astype(np.int32) << 16)) << 8 >> 8) / 8388608.0
    elif width == 4:
        x = np.frombuffer(frames, "<i4") / 2147483648.0
    else:
        raise ValueError("unsupported sample width %d bytes" % width)
    x = x[: len(x) // channels * channels].reshape(-1, channels).mean(axis=1)
    if rate != RATE and len(x):
        n = max(1, int(round(len(x) * RATE / rate)))
        spectrum = np.fft.rfft(x)
        keep = min(len(spectrum), n // 2 + 1)
        out = np.zeros(n // 2 + 1, dtype=complex)
        out[:keep] = spectrum[:keep]
        x = np.fft.irfft(out, n) * (n / len(x))
    return np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)


@app.post("/asr")
async def asr(file: UploadFile = File(...)):
    try:
        pcm = wav_to_pcm16k(await file.read())
    except ValueError as e:
        raise HTTPException(400, str(e))
    if len(pcm) == 0:
        raise HTTPException(400, "the file holds no audio")
    if len(pcm) > MAX_SECONDS * RATE:
        raise HTTPException(413, "at most %d s of audio per request" % MAX_SECONDS)
    try:
        result = await client.run(MODEL, pcm, timeout=TIMEOUT_S)
    except (ferry.QueueFull, ferry.Unavailable) as e:   # retryable: tell the caller so
        raise HTTPException(503, str(e), headers={"Retry-After": "1"})
    except ferry.Timeout as e:
        raise HTTPException(504, str(e))
    except ferry.FerryError as e:
        raise HTTPException(500, str(e))
    if not result.ok:
        raise HTTPException(502, "%s: %s" % result.error)
    tokens = result.outputs[0].tolist()
    t = result.timing
    ms = lambda a, b: round((t[b] - t[a]) / 1000.0, 3) if a in t and b in t else None
    return {
        "id": result.id,
        "tokens": tokens,                                  # as the model returned them
        "text_tokens": [i for i in tokens if i < END_OF_TEXT],
        "seconds": len(pcm) / RATE,
        "batch_size": result.batch_size,
        "worker": result.worker,
        "timing_ms": {"queue": ms("submitted", "dispatched"),
                      "compute": ms("compute_start", "compute_end"),
                      "total": ms("submitted", "finished")},
    }
