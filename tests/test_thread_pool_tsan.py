"""The C++ runtime's thread pool (cpp_ext/runtime.cpp ``run_parallel``) under ThreadSanitizer.

The pool replaced OpenMP regions in ``parallel_units``: chunks claimed by compare-exchange,
the caller working too, concurrent or nested calls running on the caller's thread. A small
native harness links runtime.cpp with ``-fsanitize=thread`` and drives it the ways the kernels
do: 2000 calls in a row (each unit written once per call, checked after), a second thread
calling while the main one nests calls inside a parallel callback, and a call whose chunks
must land on both threads. A second harness with a deliberate race (a plain counter shared
by the chunks) proves that this setup reports one.
"""
from __future__ import annotations

import os
import subprocess

from tests._helpers import ROOT, skip_if_tsan_cannot_start, tsan_toolchain

HARNESS = r"""
#include "runtime.h"
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>
namespace to { const KernelTable* table_scalar() { return nullptr; } }  // no kernels needed
using namespace to;
int main() {
    set_threads(2);
    g_par_bytes = 0;
    std::vector<int64_t> data(1 << 16, 0);
    for (int it = 0; it < 2000; ++it)
        parallel_units((int64_t)data.size(), 2, [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; ++i) data[i] += 1;
        });
    for (auto v : data) if (v != 2000) { std::printf("wrong data\n"); return 1; }
    std::vector<int64_t> d2(1 << 14, 0), d3(1 << 14, 0);
    std::thread other([&] {
        for (int it = 0; it < 500; ++it)
            parallel_units((int64_t)d2.size(), 2, [&](int64_t b, int64_t e, int) {
                for (int64_t i = b; i < e; ++i) d2[i] += 1;
            });
    });
    for (int it = 0; it < 500; ++it)
        parallel_units(64, 2, [&](int64_t b, int64_t e, int) {
            for (int64_t k = b; k < e; ++k)
                parallel_units(256, 2, [&](int64_t b2, int64_t e2, int) {
                    for (int64_t i = b2; i < e2; ++i) d3[k * 256 + i] += 1;
                });
        });
    other.join();
    for (auto v : d2) if (v != 500) { std::printf("wrong d2\n"); return 1; }
    for (auto v : d3) if (v != 500) { std::printf("wrong d3\n"); return 1; }
    std::mutex mu;
    std::vector<std::thread::id> ids;
    RACY_DECL
    for (int it = 0; it < 2000; ++it) {
        {
            std::lock_guard<std::mutex> g(mu);
            if (it >= 200 && ids.size() >= 2) break;  // at least 200 calls; more until both ran
        }
        parallel_units(1 << 12, 2, [&](int64_t b, int64_t e, int) {
            volatile double acc = 0;
            for (int64_t i = b; i < e; ++i) for (int j = 0; j < 200; ++j) acc = acc + (double)(i * j);
            RACY_USE
            std::lock_guard<std::mutex> g(mu);
            const auto id = std::this_thread::get_id();
            bool known = false;
            for (auto& x : ids) known = known || x == id;
            if (!known) ids.push_back(id);
        });
    }
    std::printf("threads %zu\nok\n", ids.size());
    return 0;
}
"""


def _run(tmp_path, racy: bool) -> subprocess.CompletedProcess:
    gxx, _ = tsan_toolchain()
    text = HARNESS.replace("RACY_DECL", "int64_t shared = 0;" if racy else "")
    text = text.replace("RACY_USE", "shared += e - b;" if racy else "")
    (tmp_path / "harness.cpp").write_text(text)
    exe = tmp_path / "harness"
    build = subprocess.run([gxx, "-std=c++20", "-O1", "-g", "-fsanitize=thread", "-pthread",
                            "-I", str(ROOT / "cpp_ext"), "-o", str(exe), str(tmp_path / "harness.cpp"),
                            str(ROOT / "cpp_ext" / "runtime.cpp")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-4000:]
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66"))
    skip_if_tsan_cannot_start(proc)
    return proc


def test_thread_pool_race_free_under_thread_sanitizer(tmp_path):
    proc = _run(tmp_path, racy=False)
    assert proc.returncode == 0 and "ok" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-4000:])
    assert "WARNING: ThreadSanitizer" not in proc.stderr, proc.stderr[-4000:]
    threads = int(proc.stdout.split("threads ")[1].split()[0])
    if os.cpu_count() and os.cpu_count() >= 2:
        assert threads == 2, proc.stdout     # the chunks did run on the pool's thread too


def test_thread_sanitizer_harness_reports_a_race(tmp_path):
    """The proof that the harness above can fail: chunks adding to one plain counter."""
    proc = _run(tmp_path, racy=True)
    assert proc.returncode == 66 and "data race" in proc.stderr, (proc.returncode, proc.stderr[-2000:])
