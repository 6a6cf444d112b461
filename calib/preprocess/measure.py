#!/usr/bin/env python3
"""Measure CPU preprocessing cost per multimodal item, as Python serving front
ends (vLLM, SGLang, Dynamo) run it: Hugging Face transformers' image
processors, video processor and Whisper feature extractor.

    python3 calib/preprocess/measure.py -o OUT.toml            # numpy paths only
    python3 calib/preprocess/measure.py --torch -o OUT.toml    # + torch ("fast") paths

The script bootstraps itself: it creates a virtual environment under
target/ (git-ignored), installs the exact pins from requirements.txt (or
requirements-torch.txt with --torch) when they are missing or changed, and
re-executes itself inside it with one compute thread and the Hugging Face hub
offline. No model weights or configs are downloaded: every processor is built
from the values of the model's published preprocessor_config.json, written out
below with the repository each value comes from.

Content is synthetic and deterministic (seeded noise over gradients, encoded
in memory with PIL; PCM WAV written with the `wave` module). Each point is the
median of --reps repetitions after --warmup untimed runs; the primary clock is
time.process_time() (CPU time of this process, robust to a loaded host), and
wall time (time.perf_counter()) is recorded next to it. Linear costs are fitted
by least squares on the medians. See README.md beside this file.
"""

import argparse
import datetime
import gc
import hashlib
import io
import json
import os
import platform
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

# One compute thread everywhere; these must be set before numpy/torch load.
THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "BLIS_NUM_THREADS": "1",
}
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
}
for _k, _v in {**THREAD_ENV, **OFFLINE_ENV}.items():
    os.environ.setdefault(_k, _v)
# Pin the threads even if the caller's environment said otherwise.
os.environ.update(THREAD_ENV)

IN_VENV_FLAG = "EASERVE_PREPROCESS_VENV"


# --------------------------------------------------------------------------
# bootstrap: virtual environment with the exact pins, then re-exec inside it
# --------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", required=True, help="TOML file to write")
    p.add_argument("--torch", action="store_true",
                   help="install torch+torchvision too and also time the torch-backed "
                        "(fast) processors, the Qwen2-VL video processor and the "
                        "torch log-mel path")
    p.add_argument("--reps", type=int, default=15, help="timed repetitions per point (>= 15)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before each point")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 3 reps, 1 warm-up, fewer sizes (not for figures)")
    p.add_argument("--venv", default=None,
                   help="virtual environment to use (default target/preprocess-venv[-torch])")
    p.add_argument("--no-venv", action="store_true",
                   help="run in the current interpreter (pins must already be installed)")
    return p.parse_args(argv)


def requirements_file(use_torch):
    return os.path.join(HERE, "requirements-torch.txt" if use_torch else "requirements.txt")


def requirements_digest(path):
    """Hash of the requirement file and every file it includes with -r."""
    h = hashlib.sha256()
    todo = [path]
    while todo:
        f = todo.pop()
        with open(f, "rb") as fh:
            data = fh.read()
        h.update(data)
        for line in data.decode().splitlines():
            line = line.strip()
            if line.startswith("-r "):
                todo.append(os.path.join(os.path.dirname(f), line[3:].strip()))
    return h.hexdigest()


def bootstrap(args, argv):
    if args.no_venv or os.environ.get(IN_VENV_FLAG) == "1":
        return
    venv = args.venv or os.path.join(
        ROOT, "target", "preprocess-venv-torch" if args.torch else "preprocess-venv")
    py = os.path.join(venv, "bin", "python")
    req = requirements_file(args.torch)
    stamp = os.path.join(venv, ".easerve-requirements.sha256")
    digest = requirements_digest(req)
    have = open(stamp).read().strip() if os.path.exists(stamp) else None
    if have != digest:
        t0 = time.perf_counter()
        if not os.path.exists(py):
            print(f"[measure] creating virtual environment {venv}", file=sys.stderr)
            subprocess.check_call([sys.executable, "-m", "venv", venv])
        print(f"[measure] installing {os.path.relpath(req, ROOT)} into {venv}", file=sys.stderr)
        subprocess.check_call([py, "-m", "pip", "install", "--disable-pip-version-check",
                               "-q", "-r", req])
        with open(stamp, "w") as fh:
            fh.write(digest + "\n")
        print(f"[measure] install took {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    env = dict(os.environ)
    env[IN_VENV_FLAG] = "1"
    os.execve(py, [py, os.path.abspath(__file__)] + argv, env)


# --------------------------------------------------------------------------
# processor configurations (from the models' preprocessor_config.json)
# --------------------------------------------------------------------------

# OpenAI CLIP normalisation, used by both vision families below.
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# llava-hf/llava-v1.6-34b-hf, preprocessor_config.json
#   image_processor_type "LlavaNextImageProcessor", processor_class "LlavaNextProcessor"
LLAVA_NEXT_CONFIG = dict(
    do_resize=True,
    size={"shortest_edge": 336},
    image_grid_pinpoints=[[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
    resample=3,                              # PIL BICUBIC
    do_center_crop=True,
    crop_size={"height": 336, "width": 336},
    do_rescale=True,
    rescale_factor=0.00392156862745098,      # 1/255
    do_normalize=True,
    image_mean=CLIP_MEAN,
    image_std=CLIP_STD,
    do_pad=True,
    do_convert_rgb=True,
)
LLAVA_NEXT_SOURCE = "llava-hf/llava-v1.6-34b-hf preprocessor_config.json"

# Qwen/Qwen2.5-VL-32B-Instruct, preprocessor_config.json
#   image_processor_type "Qwen2VLImageProcessor", processor_class "Qwen2_5_VLProcessor".
# The repository ships no video_preprocessor_config.json, so transformers builds
# Qwen2VLVideoProcessor from the same file; the values below are used for both.
QWEN_VL_CONFIG = dict(
    min_pixels=3136,                         # 56*56
    max_pixels=12845056,                     # 28*28*16384
    patch_size=14,
    temporal_patch_size=2,
    merge_size=2,
    image_mean=CLIP_MEAN,
    image_std=CLIP_STD,
)
QWEN_VL_SOURCE = "Qwen/Qwen2.5-VL-32B-Instruct preprocessor_config.json"

# openai/whisper-large-v3-turbo, preprocessor_config.json (the audio encoder of
# fixie-ai/ultravox-v0_6, whose processor wraps the same WhisperFeatureExtractor)
WHISPER_CONFIG = dict(
    feature_size=128,
    sampling_rate=16000,
    hop_length=160,
    chunk_length=30,
    n_fft=400,
    padding_value=0.0,
    return_attention_mask=False,
)
WHISPER_SOURCE = ("openai/whisper-large-v3-turbo preprocessor_config.json "
                  "(audio processor of fixie-ai/ultravox-v0_6)")

IMAGE_SIZES = [(336, 336), (672, 672), (1024, 768), (1344, 1344), (2048, 2048)]
VIDEO_FRAME_SIZES = [(448, 448), (672, 672)]
VIDEO_FRAME_COUNTS = [8, 16, 32]
AUDIO_SECONDS = [1, 5, 10, 30]
JPEG_QUALITY = 90
AUDIO_RATE = 16000


# --------------------------------------------------------------------------
# synthetic, deterministic content
# --------------------------------------------------------------------------

def synthetic_rgb(np, width, height, seed):
    """Photo-like uint8 RGB: smooth gradients + low-frequency structure + noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    xn, yn = x / max(width - 1, 1), y / max(height - 1, 1)
    r = 255 * xn
    g = 255 * yn
    b = 255 * np.sqrt(((xn - 0.5) ** 2 + (yn - 0.5) ** 2) * 2)
    f1, f2 = rng.uniform(2, 9, size=2)
    wave = 40 * np.sin(2 * np.pi * (f1 * xn + 0.3 * f2 * yn)) * np.cos(2 * np.pi * f2 * yn)
    img = np.stack([r + wave, g - wave, b + 0.5 * wave], axis=-1)
    img += rng.normal(0.0, 12.0, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode_image(Image, arr, fmt):
    buf = io.BytesIO()
    im = Image.fromarray(arr)
    if fmt == "JPEG":
        im.save(buf, format="JPEG", quality=JPEG_QUALITY)
    else:
        im.save(buf, format="PNG")
    return buf.getvalue()


def synthetic_wav(np, seconds, seed):
    """16 kHz mono 16-bit PCM WAV bytes: a few tones + noise, deterministic."""
    import wave
    rng = np.random.default_rng(seed)
    n = int(seconds * AUDIO_RATE)
    t = np.arange(n, dtype=np.float64) / AUDIO_RATE
    sig = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1375 * t * (1 + 0.01 * t))
    sig += 0.1 * rng.standard_normal(n)
    pcm = np.clip(sig * 32767 * 0.8, -32768, 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(AUDIO_RATE)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


# --------------------------------------------------------------------------
# timing and fitting
# --------------------------------------------------------------------------

class Sample:
    """Medians of one point: CPU (user+sys), wall, user, sys seconds; minor page faults."""

    def __init__(self, cpu, wall, user, sys_, minflt):
        self.cpu, self.wall, self.user, self.sys, self.minflt = cpu, wall, user, sys_, minflt


class Timer:
    def __init__(self, reps, warmup):
        self.reps, self.warmup = reps, warmup

    def __call__(self, fn):
        """Medians over self.reps runs of fn() (after warm-up), and fn's last result."""
        out = None
        for _ in range(self.warmup):
            out = fn()
        cpu, wall, user, sys_, flt = [], [], [], [], []
        for _ in range(self.reps):
            out = None
            gc.collect()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            c0, w0 = time.process_time(), time.perf_counter()
            out = fn()
            c1, w1 = time.process_time(), time.perf_counter()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu.append(c1 - c0)
            wall.append(w1 - w0)
            user.append(r1.ru_utime - r0.ru_utime)
            sys_.append(r1.ru_stime - r0.ru_stime)
            flt.append(r1.ru_minflt - r0.ru_minflt)
        return Sample(*(median(sorted(v)) for v in (cpu, wall, user, sys_, flt))), out


def median(sorted_vals):
    n = len(sorted_vals)
    m = n // 2
    return sorted_vals[m] if n % 2 else 0.5 * (sorted_vals[m - 1] + sorted_vals[m])


def fit_line(points):
    """Least squares y = a + b*x over (x, y) points; returns a, b, r2."""
    n = len(points)
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    b = sxy / sxx if sxx > 0 else 0.0
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in points)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return a, b, r2


def shapes_of(batch):
    """Compact shapes of a BatchFeature / dict of arrays or tensors."""
    out = []
    for k in sorted(batch.keys()):
        v = batch[k]
        shp = getattr(v, "shape", None)
        if shp is None and isinstance(v, (list, tuple)) and v and hasattr(v[0], "shape"):
            shp = (len(v),) + tuple(v[0].shape)
        out.append(f"{k}{tuple(int(s) for s in shp)}" if shp is not None else k)
    return " ".join(out)


# --------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------

class Run:
    def __init__(self, args):
        import numpy as np
        self.np = np
        self.args = args
        reps = 3 if args.quick else args.reps
        warmup = 1 if args.quick else args.warmup
        self.timer = Timer(reps, warmup)
        self.reps, self.warmup = reps, warmup
        self.terms = []
        self.failures = []
        self.torch = None
        if args.torch:
            import torch
            torch.set_num_threads(1)
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:
                pass
            self.torch = torch
        if args.quick:
            self.image_sizes = IMAGE_SIZES[:2] + IMAGE_SIZES[-1:]
            self.frame_counts = VIDEO_FRAME_COUNTS[:2]
            self.audio_seconds = AUDIO_SECONDS[:2] + AUDIO_SECONDS[-1:]
        else:
            self.image_sizes = IMAGE_SIZES
            self.frame_counts = VIDEO_FRAME_COUNTS
            self.audio_seconds = AUDIO_SECONDS

    def log(self, msg):
        print(f"[measure] {msg}", file=sys.stderr, flush=True)

    def add_term(self, unit, samples, labels, **fields):
        """samples: [(size, Sample)]. Fits CPU, user-only and wall lines."""
        slope_key = {"megapixel": "per_megapixel_s", "frame": "per_frame_s",
                     "audio_second": "per_audio_second_s"}[unit]
        a, b, r2 = fit_line([(x, s.cpu) for x, s in samples])
        ua, ub, _ = fit_line([(x, s.user) for x, s in samples])
        wa, wb, _ = fit_line([(x, s.wall) for x, s in samples])
        term = dict(fields)
        term["unit"] = unit
        term["per_item_s"] = a
        term[slope_key] = b
        term["r2"] = r2
        term["user_per_item_s"] = ua
        term["user_" + slope_key] = ub
        term["wall_per_item_s"] = wa
        term["wall_" + slope_key] = wb
        term["labels"] = labels
        term["points"] = [[x, s.cpu] for x, s in samples]
        term["user_points"] = [[x, s.user] for x, s in samples]
        term["sys_points"] = [[x, s.sys] for x, s in samples]
        term["wall_points"] = [[x, s.wall] for x, s in samples]
        term["minor_faults"] = [int(s.minflt) for _, s in samples]
        self.terms.append(term)
        self.log(f"{fields['family']:<11} {fields['term']:<30} a={a * 1e3:8.3f} ms  "
                 f"b={b * 1e3:8.3f} ms/{unit}  r2={r2:.3f}  (user b={ub * 1e3:7.3f})")

    def guarded(self, name, fn):
        try:
            fn()
        except Exception as e:  # record and go on with the other families
            import traceback
            traceback.print_exc()
            self.failures.append(f"{name}: {type(e).__name__}: {e}")

    # ---- images ----------------------------------------------------------

    def image_inputs(self):
        from PIL import Image
        np = self.np
        inputs = []
        for i, (w, h) in enumerate(self.image_sizes):
            arr = synthetic_rgb(np, w, h, seed=1000 + i)
            inputs.append(dict(
                w=w, h=h, mp=w * h / 1e6, label=f"{w}x{h}",
                png=encode_image(Image, arr, "PNG"),
                jpeg=encode_image(Image, arr, "JPEG"),
            ))
        return inputs

    @staticmethod
    def decode(Image, data):
        # What vLLM's ImageMediaIO.load_bytes does: open, load, convert to RGB.
        im = Image.open(io.BytesIO(data))
        im.load()
        return im.convert("RGB")

    def measure_images(self):
        from PIL import Image
        import transformers as tf
        inputs = self.image_inputs()
        self.log("images: " + ", ".join(
            f"{x['label']} png={len(x['png']) / 1e6:.2f}MB jpeg={len(x['jpeg']) / 1e6:.2f}MB"
            for x in inputs))

        # decode, shared by both families (measured once, emitted for each)
        decode_terms = {}
        for fmt in ("png", "jpeg"):
            decode_terms[fmt] = [
                (x["mp"], self.timer(lambda d=x[fmt]: self.decode(Image, d))[0]) for x in inputs]
        labels = [x["label"] for x in inputs]
        bytes_per_mp = {fmt: [len(x[fmt]) / x["mp"] for x in inputs] for fmt in ("png", "jpeg")}

        processors = [
            ("llava-next", "numpy", "LlavaNextImageProcessor",
             lambda: tf.LlavaNextImageProcessor(**LLAVA_NEXT_CONFIG), "np", LLAVA_NEXT_SOURCE),
            ("qwen2.5-vl", "numpy", "Qwen2VLImageProcessor",
             lambda: tf.Qwen2VLImageProcessor(**QWEN_VL_CONFIG), "np", QWEN_VL_SOURCE),
        ]
        if self.torch is not None:
            processors += [
                ("llava-next", "torch", "LlavaNextImageProcessorFast",
                 lambda: tf.LlavaNextImageProcessorFast(**LLAVA_NEXT_CONFIG), "pt",
                 LLAVA_NEXT_SOURCE),
                ("qwen2.5-vl", "torch", "Qwen2VLImageProcessorFast",
                 lambda: tf.Qwen2VLImageProcessorFast(**QWEN_VL_CONFIG), "pt", QWEN_VL_SOURCE),
            ]

        emitted_decode = set()
        for family, backend, cls, make, rt, source in processors:
            def one(family=family, backend=backend, cls=cls, make=make, rt=rt, source=source):
                proc = make()
                common = dict(family=family, implementation="hf-transformers", backend=backend,
                              config_source=source)
                if family not in emitted_decode:
                    emitted_decode.add(family)
                    for fmt in ("png", "jpeg"):
                        self.add_term(
                            "megapixel", decode_terms[fmt], labels,
                            **dict(common, backend="pillow", processor_class="PIL.Image",
                                   term=f"decode-{fmt}",
                                   what=f"image decode ({fmt.upper()} bytes) + convert RGB (PIL)",
                                   encoded_bytes_per_megapixel=bytes_per_mp[fmt]))
                decoded = [self.decode(Image, x["jpeg"]) for x in inputs]
                samples, shapes = [], []
                for x, im in zip(inputs, decoded):
                    smp, out = self.timer(lambda im=im: proc(images=im, return_tensors=rt))
                    samples.append((x["mp"], smp))
                    shapes.append(shapes_of(out))
                self.add_term("megapixel", samples, labels,
                              **dict(common, processor_class=cls, term=f"processor-{backend}",
                                     what=f"{cls} call on a decoded RGB image "
                                          f"(return_tensors={rt!r})",
                                     output_shapes=shapes))
                for fmt in ("png", "jpeg"):
                    samples = [(x["mp"], self.timer(
                        lambda d=x[fmt]: proc(images=self.decode(Image, d), return_tensors=rt))[0])
                        for x in inputs]
                    self.add_term("megapixel", samples, labels,
                                  **dict(common, processor_class=cls,
                                         term=f"decode-{fmt}+processor-{backend}",
                                         what=f"image decode ({fmt.upper()}) + {cls}, "
                                              f"end to end"))
            self.log(f"{family}: {cls}")
            self.guarded(f"{family} {cls}", one)

    # ---- video -----------------------------------------------------------

    def measure_video(self):
        from PIL import Image
        import transformers as tf
        np = self.np
        # one distinct JPEG per frame, per frame size
        clips = {}
        for si, (w, h) in enumerate(VIDEO_FRAME_SIZES):
            n = max(self.frame_counts)
            frames = [encode_image(Image, synthetic_rgb(np, w, h, seed=5000 + 100 * si + k), "JPEG")
                      for k in range(n)]
            clips[(w, h)] = frames

        def decode_frames(jpegs):
            return np.stack([np.asarray(self.decode(Image, j)) for j in jpegs])

        # frame decode (JPEG -> RGB ndarray), per frame size
        all_samples, all_labels = [], []
        for (w, h), jpegs in clips.items():
            samples, labels = [], []
            for n in self.frame_counts:
                smp, _ = self.timer(lambda j=jpegs[:n]: decode_frames(j))
                samples.append((n, smp))
                labels.append(f"{n}x{w}x{h}")
                all_samples.append((n * w * h / 1e6, smp))
                all_labels.append(f"{n}x{w}x{h}")
            self.add_term("frame", samples, labels,
                          family="qwen2.5-vl", implementation="hf-transformers", backend="pillow",
                          processor_class="PIL.Image", config_source=QWEN_VL_SOURCE,
                          term=f"frame-decode-jpeg-{w}x{h}",
                          what=f"video frame decode, JPEG bytes -> RGB ndarray (PIL), {w}x{h} "
                               f"frames, N frames per item",
                          encoded_bytes_per_frame=sum(len(j) for j in jpegs) / len(jpegs))
        self.add_term("megapixel", all_samples, all_labels,
                      family="qwen2.5-vl", implementation="hf-transformers", backend="pillow",
                      processor_class="PIL.Image", config_source=QWEN_VL_SOURCE,
                      term="frame-decode-jpeg",
                      what="video frame decode, JPEG -> RGB ndarray (PIL), fitted on total "
                           "megapixels of the clip (all frame sizes)")

        decoded = {k: decode_frames(v) for k, v in clips.items()}

        processors = []
        if self.torch is not None:
            processors.append(
                ("torch", "Qwen2VLVideoProcessor",
                 lambda: tf.Qwen2VLVideoProcessor(do_sample_frames=False, **QWEN_VL_CONFIG),
                 lambda p, v: p(videos=[v], return_tensors="pt", do_sample_frames=False)))
        # transformers 4.57 keeps the pre-4.52 numpy video path in the (slow)
        # image processor for backward compatibility; it is what a server
        # without torchvision would run.
        processors.append(
            ("numpy", "Qwen2VLImageProcessor(videos=)",
             lambda: tf.Qwen2VLImageProcessor(**QWEN_VL_CONFIG),
             lambda p, v: p(images=None, videos=[list(v)], return_tensors="np")))

        for backend, cls, make, call in processors:
            def one(backend=backend, cls=cls, make=make, call=call):
                proc = make()
                all_samples, all_labels = [], []
                for (w, h), frames in decoded.items():
                    samples, labels, shapes = [], [], []
                    for n in self.frame_counts:
                        clip = frames[:n]
                        smp, out = self.timer(lambda clip=clip: call(proc, clip))
                        samples.append((n, smp))
                        labels.append(f"{n}x{w}x{h}")
                        shapes.append(shapes_of(out))
                        all_samples.append((n * w * h / 1e6, smp))
                        all_labels.append(f"{n}x{w}x{h}")
                    self.add_term("frame", samples, labels,
                                  family="qwen2.5-vl", implementation="hf-transformers",
                                  backend=backend, processor_class=cls,
                                  config_source=QWEN_VL_SOURCE,
                                  term=f"video-processor-{backend}-{w}x{h}",
                                  what=f"{cls} on decoded RGB frames ({w}x{h}), N frames "
                                       f"per item, no frame sampling",
                                  output_shapes=shapes)
                self.add_term("megapixel", all_samples, all_labels,
                              family="qwen2.5-vl", implementation="hf-transformers",
                              backend=backend, processor_class=cls, config_source=QWEN_VL_SOURCE,
                              term=f"video-processor-{backend}",
                              what=f"{cls} on decoded RGB frames, fitted on total megapixels "
                                   f"of the clip (all frame sizes)")
            self.log(f"video: {cls}")
            self.guarded(f"video {cls}", one)

    # ---- audio -----------------------------------------------------------

    def measure_audio(self):
        import wave
        import transformers as tf
        import transformers.models.whisper.feature_extraction_whisper as few
        np = self.np
        wavs = [(s, synthetic_wav(np, s, seed=7000 + s)) for s in self.audio_seconds]

        def wav_decode(data):
            with wave.open(io.BytesIO(data), "rb") as w:
                raw = w.readframes(w.getnframes())
            return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0

        samples = [(sec, self.timer(lambda d=data: wav_decode(d))[0]) for sec, data in wavs]
        labels = [f"{sec}s" for sec, _ in wavs]
        self.add_term("audio_second", samples, labels,
                      family="whisper", implementation="python-stdlib", backend="numpy",
                      processor_class="wave", config_source=WHISPER_SOURCE,
                      term="decode-wav",
                      what="WAV decode, 16 kHz mono PCM16 -> float32 (wave module + numpy)")

        decoded = [(s, wav_decode(d)) for s, d in wavs]
        fe = tf.WhisperFeatureExtractor(**WHISPER_CONFIG)

        # WhisperFeatureExtractor picks the torch STFT whenever torch is
        # importable; force the numpy path by switching that check off.
        backends = ["numpy"] + (["torch"] if self.torch is not None else [])
        real_check = few.is_torch_available
        for backend in backends:
            few.is_torch_available = (lambda: True) if backend == "torch" else (lambda: False)
            try:
                for padding, term, what in (
                    ("max_length", f"log-mel-padded-30s-{backend}",
                     "WhisperFeatureExtractor log-mel (128 bins), input padded to 30 s as "
                     "Whisper does (padding='max_length')"),
                    ("longest", f"log-mel-unpadded-{backend}",
                     "WhisperFeatureExtractor log-mel (128 bins) on the audio's own length "
                     "(padding='longest', as Ultravox's processor calls it)"),
                ):
                    def one(padding=padding, term=term, what=what):
                        samples, shapes = [], []
                        for sec, audio in decoded:
                            smp, out = self.timer(lambda a=audio: fe(
                                a, sampling_rate=AUDIO_RATE, padding=padding,
                                return_tensors="np"))
                            samples.append((sec, smp))
                            shapes.append(shapes_of(out))
                        self.add_term("audio_second", samples, labels,
                                      family="whisper", implementation="hf-transformers",
                                      backend=backend, processor_class="WhisperFeatureExtractor",
                                      config_source=WHISPER_SOURCE, term=term, what=what,
                                      output_shapes=shapes)
                    self.guarded(f"whisper {term}", one)
            finally:
                few.is_torch_available = real_check


# --------------------------------------------------------------------------
# host description and TOML output
# --------------------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def page_fault_cost(np, mib=256, reps=7):
    """Median CPU seconds per minor page fault when first touching fresh anonymous
    memory (4 KiB pages) -- the price of the sys time in the figures on this host."""
    import mmap
    n = mib << 20
    vals = []
    for _ in range(reps):
        m = mmap.mmap(-1, n)
        a = np.frombuffer(m, dtype=np.uint8)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        c0 = time.process_time()
        a[::4096] = 1
        c1 = time.process_time()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        del a
        m.close()
        faults = r1.ru_minflt - r0.ru_minflt
        if faults > 0:
            vals.append((c1 - c0) / faults)
    return median(sorted(vals)) if vals else 0.0


def read_first(path):
    try:
        with open(path) as fh:
            return fh.readline().strip()
    except OSError:
        return ""


def package_pins(use_torch):
    from importlib import metadata
    names = ["transformers", "numpy", "pillow", "huggingface-hub", "tokenizers", "safetensors"]
    if use_torch:
        names += ["torch", "torchvision"]
    pins = []
    for n in names:
        try:
            pins.append(f"{n}=={metadata.version(n)}")
        except metadata.PackageNotFoundError:
            pass
    return pins


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        s = f"{v:.6g}"
        if "e" not in s and "." not in s and "inf" not in s and "nan" not in s:
            s += ".0"
        return s
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic strings
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v)} to TOML")


def write_toml(path, host, terms, failures, cmdline):
    lines = [
        "# measured by calib/preprocess/measure.py -- do not edit by hand",
        f"# command: {cmdline}",
        "# Units: seconds of CPU time of one process on one thread (time.process_time).",
        "# Each [[term]] is a least-squares line cost = per_item_s + slope * size through",
        "# `points` = [[size, median seconds], ...]; size is in `unit` (megapixels of the",
        "# input image or clip, frames, or seconds of audio). points = user+sys CPU time;",
        "# user_* fit user time alone (sys is mostly page faults on freshly mapped buffers,",
        "# minor_faults per call); wall_* fit wall-clock medians (perf_counter), which a",
        "# loaded host inflates. A negative per_item_s means the cost grows faster than",
        "# linearly over the range; use the points, or clamp a + b*x at the smallest point.",
        "",
        "[host]",
    ]
    for k, v in host.items():
        lines.append(f"{k} = {toml_value(v)}")
    if failures:
        lines.append(f"failures = {toml_value(failures)}")
    order = ["family", "term", "implementation", "backend", "processor_class", "what",
             "config_source", "unit", "per_item_s", "per_megapixel_s", "per_frame_s",
             "per_audio_second_s", "r2", "user_per_item_s", "user_per_megapixel_s",
             "user_per_frame_s", "user_per_audio_second_s", "wall_per_item_s",
             "wall_per_megapixel_s", "wall_per_frame_s", "wall_per_audio_second_s", "labels",
             "points", "user_points", "sys_points", "wall_points", "minor_faults"]
    for t in terms:
        lines += ["", "[[term]]"]
        keys = [k for k in order if k in t] + sorted(k for k in t if k not in order)
        for k in keys:
            lines.append(f"{k} = {toml_value(t[k])}")
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def main(argv):
    args = parse_args(argv)
    if args.reps < 15 and not args.quick:
        print("[measure] --reps below 15; the figures need at least 15", file=sys.stderr)
        return 2
    bootstrap(args, argv)

    t_start = time.perf_counter()
    load0 = os.getloadavg()
    run = Run(args)
    import transformers
    run.log(f"transformers {transformers.__version__}, python {platform.python_version()}, "
            f"torch={'yes' if run.torch is not None else 'no'}, reps={run.reps}, "
            f"warmup={run.warmup}")
    run.guarded("images", run.measure_images)
    run.guarded("video", run.measure_video)
    run.guarded("audio", run.measure_audio)
    fault_s = page_fault_cost(run.np)
    load1 = os.getloadavg()
    elapsed = time.perf_counter() - t_start

    host = {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count() or 0,
        "threads": 1,
        "thread_env": [f"{k}={v}" for k, v in THREAD_ENV.items()]
                      + (["torch.set_num_threads(1)"] if run.torch is not None else []),
        "python": platform.python_version(),
        "packages": package_pins(run.torch is not None),
        "torch_paths": run.torch is not None,
        "date": datetime.date.today().isoformat(),
        "clock": f"process CPU time (time.process_time), median of {run.reps} after "
                 f"{run.warmup} warm-up runs; wall time (time.perf_counter) alongside",
        "loadavg_1min_start_end": [round(load0[0], 2), round(load1[0], 2)],
        "run_seconds": round(elapsed, 1),
        "content": f"synthetic seeded gradients+noise; JPEG quality {JPEG_QUALITY}, PNG "
                   f"default compression; WAV 16 kHz mono PCM16",
        "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE") == "1",
        "kernel": platform.release(),
        "libc": "-".join(platform.libc_ver()),
        "page_fault_us": round(fault_s * 1e6, 3),
        "transparent_hugepage": read_first("/sys/kernel/mm/transparent_hugepage/enabled"),
    }
    if args.quick:
        host["quick"] = True
    cmd = "python3 calib/preprocess/measure.py " + " ".join(argv)
    write_toml(args.output, host, run.terms, run.failures, cmd)
    run.log(f"wrote {len(run.terms)} terms to {args.output} in {elapsed:.0f} s"
            + (f"; {len(run.failures)} failed: {run.failures}" if run.failures else ""))
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
