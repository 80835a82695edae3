#!/usr/bin/env bash
# GPU attach's concurrent paths, again and again, on the GPU machine: the device hash
# map's inserts racing across every thread (hashcount; into LRU maps, full ones evicting
# on nearly every insert: lru_hashcount; and into a per-CPU hash with the CPU writing
# between launches: percpu_hashcount), ring buffer records from every
# thread at once (kernelretsnoop, 131072 per run, through a ring buffer and through a
# perf event array), and an unmodified libbpf C tool
# (gpu_probes, Debian's libbpf) under `bpftime load` sharing its maps with two CUDA
# processes launching at the same time under `bpftime start`; and one process launching
# from 8 host threads at once, each on its own stream, traced by a launch program
# (launchsnoop: both runs of every launch, in order) and by entry and exit probes
# (cuda_counter). Each run is checked exactly; the last line is `N passed, M failed`.
#
#   scripts/gpu-stress.sh BPFTIME OBJECT_DIR CUDA_BUILD_DIR RUNS OUT_FILE
# OBJECT_DIR holds the .bpf.o files, gpu_probes (the loader) and the libbpf.so.1 it links.
set -uo pipefail
# A target that crashes says where (agent/src/crash.rs), in the logs that come back.
export BPFTIME_CRASH_REPORT=1
bt=$1 objs=$2 cuda=$3 runs=$4 out=$5
work=$(mktemp -d)
trap 'rm -rf "$work"; jobs -p | xargs -r kill 2>/dev/null' EXIT
passed=0 failed=0
result() {
    if [ "$2" = 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL run $run: $1: $3"; fi
}
value() { sed -n "s/^$2\[$3\]: \([0-9]*\)$/\1/p" "$1" | head -1; }
{
    for run in $(seq "$runs"); do
        store="gpu-stress-$$-$run"
        # hashcount: 64 keys, each 1048576 / 64 x 10.
        log=$work/hash
        timeout 300 "$bt" --store "$store" run "$objs/hashcount.bpf.o" -- "$cuda/vec_add" 1048576 10 256 >"$log" 2>&1
        keys=$(grep -c '^by_lane\[' "$log")
        off=$(sed -n 's/^by_lane\[[0-9]*\]: \([0-9]*\)$/\1/p' "$log" | grep -vcx 163840)
        ok=0; [ "$keys" = 64 ] && [ "$off" = 0 ] && ok=1
        result hashcount $ok "$keys keys, $off off"
        # lru_hashcount: the same counts in an LRU map, and a million threads a launch
        # inserting keys of their own into full LRU maps (plain and per-CPU): every
        # update succeeds, by eviction, and each map ends holding at most 1024 keys.
        log=$work/lru
        timeout 300 "$bt" --store "$store" run "$objs/lru_hashcount.bpf.o" -- "$cuda/vec_add" 1048576 10 256 >"$log" 2>&1
        keys=$(grep -c '^by_lane\[' "$log")
        off=$(sed -n 's/^by_lane\[[0-9]*\]: \([0-9]*\)$/\1/p' "$log" | grep -vcx 163840)
        recent=$(grep -c '^recent\[' "$log") recent_pc=$(grep -c '^recent_percpu\[' "$log")
        updated=$(value "$log" outcome 0) refused=$(value "$log" outcome 1)
        updated_pc=$(value "$log" outcome 2) refused_pc=$(value "$log" outcome 3)
        ok=0
        [ "$keys" = 64 ] && [ "$off" = 0 ] && [ "$updated" = 10485760 ] && [ "${refused:-0}" = 0 ] &&
            [ "$updated_pc" = 10485760 ] && [ "${refused_pc:-0}" = 0 ] &&
            [ "$recent" -gt 0 ] && [ "$recent" -le 1024 ] && [ "$recent_pc" -gt 0 ] && [ "$recent_pc" -le 1024 ] && ok=1
        result lru_hashcount $ok "$keys keys, $off off; updates $updated/$updated_pc, failed ${refused:-0}/${refused_pc:-0}, keys $recent/$recent_pc"
        # percpu_hashcount: the same races into a per-CPU hash (a value per key and SM),
        # with the CPU making and writing keys between launches.
        log=$work/percpu-hash
        timeout 300 "$bt" --store "$store" run "$objs/percpu_hashcount.bpf.o" -- "$cuda/vec_add" 1048576 10 256 >"$log" 2>&1
        keys=$(grep -c '^by_lane\[' "$log")
        off=$(sed -n 's/^by_lane\[[0-9]*\]: \([0-9]*\)$/\1/p' "$log" | grep -vcx 163840)
        made=$(value "$log" from_cpu 0)
        ok=0; [ "$keys" = 64 ] && [ "$off" = 0 ] && [ "$made" = 10437184 ] && ok=1
        result percpu_hashcount $ok "$keys keys, $off off, from_cpu[0] $made (expected 10437184)"
        # kernelretsnoop: 65536 threads x 2 launches, one record each.
        log=$work/ring
        timeout 300 "$bt" --store "$store" run "$objs/kernelretsnoop.bpf.o" -- "$cuda/vec_add" 65536 2 256 >"$log" 2>&1
        events=$(grep -c '^event events 24B' "$log")
        ok=0; [ "$events" = 131072 ] && ok=1
        result kernelretsnoop $ok "$events of 131072 events"
        # The same records through a perf event array: every thread's record lands in the
        # perf buffer of the CPU our reader runs on, far more at once than it holds, so
        # most wait in the replica's backlog; none may be lost, and none counted lost.
        log=$work/perf
        timeout 300 "$bt" --store "$store" run "$objs/kernelretsnoop_perf.bpf.o" -- "$cuda/vec_add" 65536 2 256 >"$log" 2>&1
        events=$(grep -c '^event events 28B' "$log")
        lost=$(grep -c 'lost\|dropped' "$log")
        ok=0; [ "$events" = 131072 ] && [ "$lost" = 0 ] && grep -q 'check=ok' "$log" && ok=1
        result "kernelretsnoop through a perf event array" $ok "$events of 131072 events, $lost lines of lost or dropped records"
        # One tool, two CUDA processes at once, one set of maps.
        log=$work/tool
        LD_LIBRARY_PATH="$objs" "$bt" --store "$store" load "$objs/gpu_probes" --obj "$objs/gpu_probes.bpf.o" >"$log" 2>&1 &
        tool=$!
        for _ in $(seq 200); do grep -qx ready "$log" && break; sleep 0.05; done
        "$bt" --store "$store" start "$cuda/vec_add" 1048576 10 >"$work/a" 2>&1 &
        a=$!
        "$bt" --store "$store" start "$cuda/vec_add" 1048576 10 >"$work/b" 2>&1 &
        b=$!
        wait $a; sa=$?
        wait $b; sb=$?
        kill -INT $tool; wait $tool
        entries=$(sed -n 's/^count\[0\]=//p' "$log") exits=$(sed -n 's/^count\[1\]=//p' "$log")
        elements=$(sed -n 's/^count\[2\]=//p' "$log")
        ok=0
        [ "$sa$sb" = 00 ] && grep -q 'check=ok' "$work/a" && grep -q 'check=ok' "$work/b" &&
            [ "$entries" = 20971520 ] && [ "$exits" = 20971520 ] &&
            [ "$elements" = $((20971520 * 1048576)) ] && ok=1
        result "one libbpf tool, two CUDA processes" $ok "apps $sa/$sb, entries $entries exits $exits (expected 20971520 each), sum of n $elements"
        # Launches from 8 threads at once: 8 x 200 launches, each seen at its call and
        # once completed, the completion never before the call.
        log=$work/threads-launch
        timeout 300 "$bt" --store "$store" run "$objs/launchsnoop.bpf.o" -- "$cuda/vec_add_threads" 65536 200 8 >"$log" 2>&1
        calls=$(value "$log" stats 0) done=$(value "$log" stats 1) orphan=$(value "$log" stats 8)
        early=$(value "$log" stats 5) events=$(grep -c '^event events ' "$log")
        ok=0
        grep -q 'check=ok' "$log" && [ "$calls" = 1600 ] && [ "$done" = 1600 ] && [ "$events" = 1600 ] &&
            [ "$orphan" = 0 ] && [ "$early" = 0 ] && ok=1
        result "launch events from 8 threads" $ok "$calls calls, $done completed, $events events (expected 1600 each), $orphan completions without their call, $early before their call"
        # The same launches, every thread of every one counted at entry and exit.
        log=$work/threads-count
        timeout 300 "$bt" --store "$store" run "$objs/cuda_counter.bpf.o" -- "$cuda/vec_add_threads" 65536 200 8 >"$log" 2>&1
        entries=$(value "$log" counts 0) exits=$(value "$log" counts 1)
        ok=0
        grep -q 'check=ok' "$log" && [ "$entries" = 104857600 ] && [ "$exits" = 104857600 ] && ok=1
        result "device probes on launches from 8 threads" $ok "entries $entries exits $exits (expected 104857600 each)"
        rm -rf "/dev/shm/bpftime-$store"
    done
    echo "GPU stress, $(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1): $runs runs of 8 checks"
    echo "$passed passed, $failed failed"
} | tee "$out"
grep -q ' 0 failed$' "$out"
