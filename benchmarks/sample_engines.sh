#!/bin/bash
# Where vLLM's engine cores spend their time during `mmbatch bench` on the GPU host:
# every ~12 s, 5 s of py-spy (200 Hz, every thread, without pausing them) on each
# VLLM::EngineCore process and on its parent (the side's front end: the bench worker, or
# mmbatch's engine process), named after the side then running (its spec-MODE.json);
# index.txt also logs each core's thread count and OMP_NUM_THREADS (torch's thread pool).
#   bash benchmarks/sample_engines.sh PY_SPY_WHEEL OUTDIR &   # then: kill $!
# PY_SPY_WHEEL is py-spy's manylinux wheel (pip download --no-deps --only-binary=:all: py-spy);
# each raw file sums up by thread and function (docs/performance.md says what it found).
wheel=$1 out=$2
mkdir -p "$out" /tmp/py-spy && python3 -m zipfile -e "$wheel" /tmp/py-spy
spy=$(ls /tmp/py-spy/*.data/scripts/py-spy) && chmod +x "$spy"
i=0
while true; do
  sleep 7; i=$((i + 1))
  worker=$(pgrep -f 'mmbatch[.]bench[.]worker' | head -1)
  side=$(tr '\0' ' ' < "/proc/$worker/cmdline" 2>/dev/null | grep -o 'spec-[A-Za-z0-9_]*' | head -1)
  for core in $(pgrep -f 'VLLM::EngineCore'); do
    front=$(ps -o ppid= -p "$core" | tr -d ' ')
    threads=$(ls "/proc/$core/task" 2>/dev/null | wc -l)
    omp=$(tr '\0' '\n' < "/proc/$core/environ" 2>/dev/null | grep '^OMP_NUM_THREADS=')
    echo "$i $(date +%s.%N) $side core=$core front=$front threads=$threads ${omp:-OMP_NUM_THREADS=unset}" \
      >> "$out/index.txt"
    for pid in "$core" "$front"; do
      name=$([ "$pid" = "$core" ] && echo core || echo front)
      timeout 9 "$spy" record --pid "$pid" --duration 5 --rate 200 --format raw --threads \
        --nonblocking -o "$out/$name-$i-$side.txt" > /dev/null 2>&1 &
    done
  done
  wait
done
