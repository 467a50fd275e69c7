"""examples/fastapi_asr end to end: a fleet serving whisper.pt (padding buckets, as
docs/models.md recommends), the app under uvicorn, 64 concurrent HTTP requests with espeak-ng
speech; every answer equals what the plain client gets for the same PCM, and the fleet batched
the requests."""

import asyncio
import os
import shutil
import subprocess
import sys
import wave

import numpy as np
import pytest

import ferry
from fleet import REPO, Fleet, free_port, wait_for

APP_DIR = os.path.join(REPO, "examples", "fastapi_asr")
PHRASES = [
    "hello world", "ferry keeps the GPU busy", "one two three four", "good morning",
    "the quick brown fox", "batch the requests", "speech to text", "what time is it",
    "open the pod bay doors", "it is raining again", "seven eight nine", "call me later",
    "turn left at the light", "thank you very much", "see you tomorrow", "where is the station",
]

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def make_wavs(tmp_path):
    """One WAV per phrase from espeak-ng (22,050 Hz mono), several voices and speeds; plus a
    stereo 44.1 kHz and an 8 kHz version of the first, to exercise the conversion."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.fail("espeak-ng is not installed (scripts/install-deps.sh installs it)")
    procs, paths = [], []
    for k, text in enumerate(PHRASES):
        for speed in (150, 190):
            path = str(tmp_path / ("speech%02d_%d.wav" % (k, speed)))
            procs.append(subprocess.Popen([espeak, "-s", str(speed), "-w", path, text]))
            paths.append(path)
    for p in procs:
        assert p.wait(60) == 0
    with wave.open(paths[0]) as w:
        rate, mono = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), "<i2")
    for name, new_rate, channels in (("stereo44k.wav", 44100, 2), ("mono8k.wav", 8000, 1)):
        n = int(len(mono) * new_rate / rate)
        x = np.interp(np.linspace(0, len(mono) - 1, n), np.arange(len(mono)), mono)
        x = np.repeat(x[:, None], channels, axis=1).astype("<i2")
        path = str(tmp_path / name)
        with wave.open(path, "wb") as w:
            w.setnchannels(channels)
            w.setsampwidth(2)
            w.setframerate(new_rate)
            w.writeframes(x.tobytes())
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def asr(models_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("asr")
    models = tmp / "models.toml"
    models.write_text(
        '[models.whisper]\npath = "%s"\nmax_batch = 16\n\n'
        '[models.whisper.padding]\ninputs = [0]\ndim = 0\nvalue = 0.0\n'
        'buckets = [48000, 96000, 480000]\n' % os.path.join(models_dir, "whisper.pt"))
    f = Fleet(models_dir, models_file=str(models))
    port = free_port()
    env = dict(os.environ, FERRY_FRONTEND=f.frontend, FERRY_REDIS=f.redis_url)
    if os.environ.get("FERRY_TEST_INSTALLED") != "1":
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
            + [p for p in [os.environ.get("PYTHONPATH")] if p])
    log = open(str(tmp / "uvicorn.log"), "wb")
    app = subprocess.Popen([sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1",
                            "--port", str(port), "--app-dir", APP_DIR],
                           env=env, stdout=log, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % port

    def up():
        assert app.poll() is None, open(str(tmp / "uvicorn.log")).read()
        try:
            return httpx.get(url + "/openapi.json", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False
    try:
        wait_for(up, 60, "uvicorn serving the app", every=0.05)
        yield f, url, make_wavs(tmp)
    finally:
        app.terminate()
        app.wait(20)
        log.close()
        f.stop()


def test_64_concurrent_requests_each_equal_to_the_plain_client(asr):
    fleet, url, wavs = asr
    sys.path.insert(0, APP_DIR)
    try:
        from app import wav_to_pcm16k
    finally:
        sys.path.remove(APP_DIR)
    files = [wavs[k % len(wavs)] for k in range(68)]  # every file, some twice
    blobs = {p: open(p, "rb").read() for p in wavs}

    async def post_all():
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
            return await asyncio.gather(*[
                http.post("/asr", files={"file": (os.path.basename(p), blobs[p], "audio/wav")})
                for p in files])
    responses = asyncio.run(post_all())

    pcms = {p: wav_to_pcm16k(blobs[p]) for p in wavs}
    assert all(0.5 < len(x) / 16000 < 3.0 for x in pcms.values())  # all in the 3 s bucket
    s22 = pcms[wavs[0]]
    # The 44.1 kHz stereo and 8 kHz copies of the first clip: the same length at 16 kHz.
    assert abs(len(pcms[wavs[-2]]) - len(s22)) <= 2 and abs(len(pcms[wavs[-1]]) - len(s22)) <= 2
    with ferry.Client(fleet.frontend, fleet.redis_url) as c:
        ids = c.submit_many([ferry.Job("whisper", pcms[p]) for p in wavs])
        want = {p: c.wait(i, timeout=120) for p, i in zip(wavs, ids)}
    for p, resp in zip(files, responses):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        w = want[p]
        assert w.status == "done" and w.outputs[0].dtype == np.int64
        assert body["tokens"] == w.outputs[0].tolist(), p
        assert len(body["tokens"]) == 24
        assert body["text_tokens"] == [t for t in body["tokens"] if t < 50257]
        assert body["seconds"] == len(pcms[p]) / 16000
    sizes = [r.json()["batch_size"] for r in responses]
    print("batch sizes of the 68 requests:", sorted(sizes))
    assert max(sizes) > 1, sizes  # the requests shared batches


def test_bad_uploads(asr):
    _, url, _ = asr
    r = httpx.post(url + "/asr", files={"file": ("x.wav", b"not a wav file", "audio/wav")})
    assert r.status_code == 400 and "WAV" in r.json()["detail"]
    r = httpx.post(url + "/asr")
    assert r.status_code == 422  # no file
