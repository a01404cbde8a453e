"""A small native program: what the hardware's memory does when a compiler is out of the way.

STREAM-style C kernels (McCalpin's STREAM; the all-core read of likwid-bench's `load` and of
gpu-benches), compiled on the fly with `gcc -O3 -march=native -fopenmp` and run in a child
process, so the roofs of `peaks` are checked against a program that is not XLA:

  * `stream N REPS T`: read (a sum with 8 independent accumulators of the widest native
    vector, so it is bound by loads, not by the add latency; each thread's contiguous slice
    read as 4 parts side by side, four streams in flight per core), in-place scale and triad
    over arrays of N floats, with T threads each on its own slice; REPS timed repetitions
    each.
  * `serve N T`: allocate and fill once, then one `stream` measurement per line on stdin.
  * `sweep LO HI RATIO MIN_BYTES T`: the read kernel over a geometric ladder of working sets,
    each thread re-reading its own slice (size / T) until MIN_BYTES have moved, so a slice
    that fits a core's cache is read from that cache: the bandwidth of each cache level at a
    fixed thread count.

Threads are pinned (OMP_PROC_BIND=close, OMP_PLACES=cores) so slices stay with their caches.
Byte convention: algorithmic (read 4 B, in-place scale 8 B, triad 12 B per element).
Returns None (the caller says so) when no C compiler is found.

Public API:
    available() -> bool
    stream(n, reps, threads) -> {"threads", "n", "read": [s], "scale_inplace": [s], "triad": [s]}
    Server(n, threads).stream(reps)   the same, arrays allocated once in a long-lived child
    Server(n, threads).read(reps)     the read alone: {"threads", "n", "read": [s]}
    Server(n, threads, read_only=True) one array and read() only (the drift probe's)
    sweep(lo, hi, ratio, min_bytes, threads) -> [{"bytes", "seconds": [s], "repeats"}]
    BYTES_PER_ELEMENT
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
import weakref
from pathlib import Path

from microbench.roofs.peers import close_child, peer_environment

BYTES_PER_ELEMENT = {"read": 4, "scale_inplace": 8, "triad": 12}

_SOURCE = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#define VL 16 /* f32 lanes of the widest native vector */
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4
#endif
typedef float vec __attribute__((vector_size(4 * VL)));
#define BLOCK 128 /* floats per thread slice granule: a multiple of 8 vectors */
static double now(void) { return omp_get_wtime(); }
/* Each thread's slice is read as PARTS parts side by side (a stream per part, 2 accumulators
   each): more streams in flight per core, as a GEMV over several weight rows has, read main
   memory faster than one stream per thread does. */
#define PARTS 4
static float read_slice(const float *a, long n, long reps) {
  vec s[PARTS][2];
  for (int p = 0; p < PARTS; p++) s[p][0] = s[p][1] = (vec){0};
  const vec *v = (const vec *)a;
  long m = n / VL, part = m / PARTS / 2 * 2;
  for (long r = 0; r < reps; r++) {
    for (long i = 0; i < part; i += 2)
      for (int p = 0; p < PARTS; p++) {
        s[p][0] += v[p * part + i]; s[p][1] += v[p * part + i + 1];
      }
    for (long i = PARTS * part; i < m; i++) s[0][0] += v[i];
  }
  vec t8 = {0};
  for (int p = 0; p < PARTS; p++) t8 += s[p][0] + s[p][1];
  float t = 0.0f;
  for (int k = 0; k < VL; k++) t += t8[k];
  return t;
}
static float *alloc(long n) {
  float *p = aligned_alloc(64, (size_t)n * sizeof(float));
  if (!p) { fprintf(stderr, "out of memory for %ld floats\n", n); exit(2); }
  return p;
}
static void fill(float *a, long n, float base) {
  #pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++) a[i] = base + 0.001f * (float)(i % 1031);
}
/* Run the read kernel over `size_f` floats with t threads, `reps` passes; seconds. */
static double timed_read(const float *a, long size_f, int t, long reps, float *sink) {
  long slice = size_f / t;
  float acc = 0.0f;
  double t0 = now();
  #pragma omp parallel num_threads(t) reduction(+:acc)
  { acc += read_slice(a + (long)omp_get_thread_num() * slice, slice, reps); }
  double dt = now() - t0;
  *sink += acc;
  return dt;
}
static float *A, *B, *C;
static int stream_once(long n, int reps, int t, int kernels) {
  float *a = A, *b = B, *c = C;
  const float s = 0.999f;
  float sink = 0.0f;
  printf("{\"threads\": %d, \"n\": %ld", t, n);
  const char *names[3] = {"read", "scale_inplace", "triad"};
  for (int kern = 0; kern < kernels; kern++) {
    printf(", \"%s\": [", names[kern]);
    for (int r = -1; r < reps; r++) {
      double dt;
      if (kern == 0) {
        dt = timed_read(a, n, t, 1, &sink);
      } else if (kern == 1) {
        double t0 = now();
        #pragma omp parallel for simd schedule(static)
        for (long i = 0; i < n; i++) a[i] = s * a[i];
        dt = now() - t0;
      } else {
        double t0 = now();
        #pragma omp parallel for simd schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        dt = now() - t0;
      }
      if (r >= 0) printf("%s%.9f", r ? ", " : "", dt);
    }
    printf("]");
  }
  printf(", \"sink\": %g}\n", (double)sink);
  fflush(stdout);
  return 0;
}
static long setup(long n, int t, int arrays) {
  n -= n % (BLOCK * t);
  omp_set_num_threads(t);
  A = alloc(n);
  fill(A, n, 1.0f);
  if (arrays == 3) {
    B = alloc(n); C = alloc(n);
    fill(B, n, 0.5f); fill(C, n, 0.25f);
  }
  return n;
}
static int stream(long n, int reps, int t) { return stream_once(setup(n, t, 3), reps, t, 3); }
/* Allocate once, then one stream_once per "REPS" line on stdin (so rounds skip page faults);
   a line "-REPS": the read alone (a drift probe). `read_only`: one array, "-REPS" lines only. */
static int serve(long n, int t, int read_only) {
  n = setup(n, t, read_only ? 1 : 3);
  printf("{\"ready\": true, \"n\": %ld}\n", n);
  fflush(stdout);
  int reps;
  while (scanf("%d", &reps) == 1 && reps != 0) {
    if (reps > 0 && read_only) reps = -reps;
    stream_once(n, reps > 0 ? reps : -reps, t, reps > 0 ? 3 : 1);
  }
  return 0;
}
static int sweep(long lo, long hi, double ratio, long min_bytes, int t) {
  long hi_f = hi / 4;
  hi_f -= hi_f % (BLOCK * t);
  float *a = alloc(hi_f);
  fill(a, hi_f, 1.0f);
  float sink = 0.0f;
  printf("{\"threads\": %d, \"points\": [", t);
  long last = 0;
  int first = 1;
  for (double size = (double)lo; size <= (double)hi * 1.0001; size *= ratio) {
    long n = (long)(size / 4);
    n -= n % (BLOCK * t);
    if (n <= 0 || n == last) continue;
    last = n;
    long reps = min_bytes / (4 * n);
    if (reps < 1) reps = 1;
    timed_read(a, n, t, reps, &sink); /* warm: each slice into its core's caches */
    printf("%s{\"bytes\": %ld, \"repeats\": %ld, \"seconds\": [", first ? "" : ", ", 4 * n, reps);
    first = 0;
    for (int k = 0; k < 5; k++)
      printf("%s%.9f", k ? ", " : "", timed_read(a, n, t, reps, &sink));
    printf("]}");
  }
  printf("], \"sink\": %g}\n", (double)sink);
  return 0;
}
int main(int argc, char **argv) {
  if (argc == 5 && !strcmp(argv[1], "stream"))
    return stream(atol(argv[2]), atoi(argv[3]), atoi(argv[4]));
  if ((argc == 4 || (argc == 5 && !strcmp(argv[4], "read"))) && !strcmp(argv[1], "serve"))
    return serve(atol(argv[2]), atoi(argv[3]), argc == 5);
  if (argc == 7 && !strcmp(argv[1], "sweep"))
    return sweep(atol(argv[2]), atol(argv[3]), atof(argv[4]), atol(argv[5]), atoi(argv[6]));
  fprintf(stderr, "usage: stream N REPS T | serve N T [read] | sweep LO HI RATIO MIN_BYTES T\n");
  return 2;
}
"""

COMPILER_FLAGS = ("-O3", "-march=native", "-fopenmp")


def available() -> bool:
    return shutil.which("gcc") is not None


@functools.lru_cache(maxsize=1)
def _binary() -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FileNotFoundError("gcc not found: the native peer program cannot be built")
    tmp = Path(tempfile.mkdtemp(prefix="microbench-native-"))
    atexit.register(shutil.rmtree, tmp, True)
    src, exe = tmp / "native.c", tmp / "native"
    src.write_text(_SOURCE)
    subprocess.run([gcc, *COMPILER_FLAGS, str(src), "-o", str(exe)], check=True,
                   capture_output=True, timeout=120)
    return exe


def _env() -> dict:
    return {**peer_environment(), "OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}


def _run(*args) -> dict:
    res = subprocess.run([str(_binary()), *map(str, args)], capture_output=True, text=True,
                         timeout=600, env=_env())
    if res.returncode != 0:
        raise RuntimeError(f"native peer {' '.join(map(str, args))} failed: "
                           f"{res.stderr.strip()[-300:]}")
    return json.loads(res.stdout)


def label(threads: int) -> str:
    return f"gcc -O3 -march=native, {threads} thread{'s' if threads > 1 else ''}"


def stream(n: int, reps: int, threads: int | None = None) -> dict:
    """Seconds per repetition of read / in-place scale / triad over n floats."""
    threads = threads or len(os.sched_getaffinity(0))
    return _run("stream", n, reps, threads)


class Server:
    """The stream kernels in a child that allocates its arrays once and then answers one
    measurement per call: rounds pay for page faults once, not every round. `read_only`: one
    array, not three, and only `read` (a drift probe's: a third of the memory)."""

    def __init__(self, n: int, threads: int | None = None, read_only: bool = False):
        self.threads = threads or len(os.sched_getaffinity(0))
        self.read_only = read_only
        self._proc = subprocess.Popen([str(_binary()), "serve", str(n), str(self.threads),
                                       *(["read"] if read_only else [])],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=_env())
        # ends the child when closed, collected or at exit (before modules are torn down)
        self._finalizer = weakref.finalize(self, close_child, self._proc, "0\n")
        self.n = json.loads(self._readline())["n"]

    def _readline(self) -> str:
        line = self._proc.stdout.readline()
        if not line:
            err = self._proc.stderr.read().strip()[-300:]
            raise RuntimeError(f"native peer server stopped: {err or 'no output'}")
        return line

    def stream(self, reps: int = 5) -> dict:
        if self.read_only:
            raise ValueError("Server(read_only=True) runs the read alone: call read(), not "
                             "stream()")
        self._proc.stdin.write(f"{reps}\n")
        self._proc.stdin.flush()
        return json.loads(self._readline())

    def read(self, reps: int = 3) -> dict:
        """The read kernel alone, `reps` timed passes: {"threads", "n", "read": [s]}."""
        self._proc.stdin.write(f"-{reps}\n")
        self._proc.stdin.flush()
        return json.loads(self._readline())

    def close(self) -> None:
        self._finalizer()


def sweep(lo: int, hi: int, ratio: float, min_bytes: int, threads: int) -> list[dict]:
    """Seconds per call (5 samples) of the all-slices read at each working-set size."""
    return _run("sweep", lo, hi, ratio, min_bytes, threads)["points"]
