#!/usr/bin/env bash
# The GPU examples and GPU attach checks, on the GPU machine (scripts/gpu.sh runs it):
# each example under `bpftime run` on CUDA programs built here with nvcc (static cudart,
# shared cudart, the driver API loading PTX and a fatbin), checked exactly; then the bad
# cases. One PASS or FAIL line per check, then `N passed, M failed`.
#
#   scripts/gpu-examples.sh BPFTIME OBJECT_DIR OUT_FILE
#   GPU_EXAMPLES_ONLY=several_gpus: only the checks that need two GPUs or more
#   GPU_EXAMPLES_ONLY=quick: only cuda_counter on every kind of build and the panics
#                           injected into CUDA entry points (a few minutes, for a session
#                           whose device time is short)
set -uo pipefail
# A target that crashes says where (agent/src/crash.rs), in the logs that come back.
export BPFTIME_CRASH_REPORT=1
bt=$1 objs=$2 out=$3
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
work=$(mktemp -d)
logs=${GPU_EXAMPLES_LOGS:-$work/logs}
mkdir -p "$logs"
trap 'rm -rf "$work"' EXIT
cuda=$work/cuda
passed=0 failed=0
result() {  # result NAME OK DETAIL
    if [ "$2" = 1 ]; then
        passed=$((passed + 1)); echo "PASS $1${3:+: $3}"
    else
        failed=$((failed + 1)); echo "FAIL $1${3:+: $3}"
    fi
}
value() {  # value LOG MAP KEY
    sed -n "s/^$2\[$3\]: \([0-9]*\)$/\1/p" "$1" | head -1
}
hist_sum() {  # hist_sum FILE MAP: the counts of a log2 histogram as bpftime prints it, summed
    awk -v m="$2" '/^[a-z_0-9]+ \(/ { on = ($1 == m) } on && /^\[/ { s += $3 } END { print s + 0 }' "$1"
}
field() {  # field LOG NAME (from the app's own line)
    grep -o "$2=[0-9.]*" "$1" | head -1 | cut -d= -f2
}
run() {  # run LOG ARGS... : bpftime run ARGS, output and exit status in LOG.out
    local log=$1
    shift
    timeout 300 "$bt" --store "gpu-ex-$$" run "$@" >"$log.out" 2>&1
    echo "exit=$?" >>"$log.out"
    # Kept for a failed check to be looked at (without the long per-thread maps).
    grep -v '^starts\[' "$log.out" | head -c 2000000 >"$logs/$(basename "$log").out" 2>/dev/null
}
several_gpus() {  # the checks that need two GPUs or more; a SKIP line on one
    # Several GPUs: vectorAdd on every device of the machine (a context each), counted at
    # entry and exit and at every access, exact over all of them.
    gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
    if [ "$gpus" -ge 2 ]; then
        n=1048576 iters=5
        expect=$((gpus * iters * n))
        # One host thread launching on every GPU, then a host thread per GPU, all launching
        # at once: contexts made, modules built and maps synced from several threads
        # together.
        for threads in 0 1; do
            how="" tag=""
            [ $threads = 1 ] && how=", a host thread each" tag=-threads
            log=$work/multi-counter$tag
            run "$log" "$objs/cuda_counter.bpf.o" -- "$cuda/multi_gpu" $n $iters $threads
            entries=$(value "$log.out" counts 0) exits=$(value "$log.out" counts 1)
            ok=0; grep -q "host_threads=$threads .*check=ok" "$log.out" && [ "$entries" = $expect ] && [ "$exits" = $expect ] && ok=1
            result "cuda_counter on $gpus GPUs$how" $ok "entries $entries exits $exits (expected $expect each)"
            log=$work/multi-ldst$tag
            run "$log" "$objs/access_check.bpf.o" -- "$cuda/multi_gpu" $n $iters $threads
            la=$(value "$log.out" vector_add 0) lb=$(value "$log.out" vector_add 1) sc=$(value "$log.out" vector_add 2)
            outside=$(value "$log.out" vector_add 4)
            ok=0; grep -q "host_threads=$threads .*check=ok" "$log.out" && [ "$la" = $expect ] && [ "$lb" = $expect ] && [ "$sc" = $expect ] && [ "$outside" = 0 ] && ok=1
            result "memory-access probe on $gpus GPUs$how, exact" $ok "loads a $la b $lb, stores c $sc (expected $expect each), outside $outside"
        done
        log=$work/multi-snoop-threads
        run "$log" "$objs/launchsnoop.bpf.o" -- "$cuda/multi_gpu" $n $iters 1
        calls=$(value "$log.out" stats 0) done=$(value "$log.out" stats 1) threads=$(value "$log.out" stats 6)
        orphan=$(value "$log.out" stats 8)
        ok=0; grep -q 'host_threads=1 .*check=ok' "$log.out" && [ "$calls" = $((gpus * iters)) ] &&
            [ "$done" = $((gpus * iters)) ] && [ "$threads" = $expect ] && [ "$orphan" = 0 ] && ok=1
        result "launch events on $gpus GPUs, a host thread each" $ok "$calls calls, $done completed (expected $((gpus * iters)) each), $threads threads (expected $expect), $orphan completions without a call run"
    else
        echo "SKIP several GPUs: this machine has $gpus (the nvidia-h200-x2 kind has two)"
    fi
}
{
    echo "GPU examples, $(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(nvcc --version | tail -1)"
    if ! make -s -C bpf-examples/cuda OUT="$cuda" NVCC=nvcc >"$work/make.log" 2>&1; then
        result "build the CUDA programs" 0 "$(tail -3 "$work/make.log")"
    fi
    # GPU_EXAMPLES_ONLY=several_gpus: the multi-GPU checks alone, for a machine of several
    # GPUs whose time is dear.
    if [ "${GPU_EXAMPLES_ONLY:-}" = several_gpus ]; then
        several_gpus
        echo "$passed passed, $failed failed"
        exit
    fi

    # cuda_counter: every thread counted at entry and exit, on every kind of build.
    n=1048576 iters=10
    for app in "vec_add" "vec_add_shared" "vec_add_driver $cuda/vec_add.ptx" "vec_add_driver $cuda/vec_add.fatbin"; do
        set -- $app
        log=$work/counter-$1-$(basename "${2:-static}")
        exe=$cuda/$1; shift
        run "$log" "$objs/cuda_counter.bpf.o" -- "$exe" "$@" $n $iters
        entries=$(value "$log.out" counts 0) exits=$(value "$log.out" counts 1)
        total=$(value "$log.out" counts 2) max=$(value "$log.out" counts 3)
        ms_max=$(field "$log.out" ms_max)
        ok=0
        if grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
            [ "$entries" = $((n * iters)) ] && [ "$exits" = $((n * iters)) ] &&
            [ "${total:-0}" -gt 0 ] && [ "${max:-0}" -gt 0 ] &&
            awk -v m="$max" -v l="$ms_max" 'BEGIN { exit !(m <= l * 1e6) }'; then
            ok=1
        fi
        result "cuda_counter on $app" $ok "entries $entries exits $exits (expected $((n * iters)) each), mean thread $(awk -v t="$total" -v e="$exits" 'BEGIN { if (e) printf "%.0f", t / e }') ns, longest $max ns <= longest launch ${ms_max} ms"
    done

    # A panic in our code inside a CUDA entry point (BPFTIME_INJECT_PANIC names the entry
    # point, agent side): the application's call still goes through, once, to the driver,
    # the panic is reported once, and the application ends as it would have (its own check
    # passes, exit 0). The launches then run uninstrumented, or the module is not noted.
    n=1048576 iters=5
    # (nvcc's static cudart loads its fatbin with cuLibraryLoadData: docs/ARCHITECTURE.md decision 6.)
    for case in "cuLaunchKernel vec_add" "cuLaunchKernel vec_add_shared" "cuLibraryLoadData vec_add"; do
        set -- $case
        entry=$1 app=$2
        {
            log=$work/panic-$entry-$app
            BPFTIME_INJECT_PANIC=$entry run "$log" "$objs/cuda_counter.bpf.o" -- "$cuda/$app" $n $iters
            reports=$(grep -c "^bpftime: internal error in $entry " "$log.out")
            entries=$(value "$log.out" counts 0)
            ok=0
            if grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" && [ "$reports" = 1 ] &&
                { [ "$entry" != cuLaunchKernel ] || [ "${entries:-0}" = 0 ]; }; then
                ok=1
            fi
            result "a panic injected in $entry on $app: the app runs on" $ok "$(grep -o 'check=[a-z]*' "$log.out" | head -1), $(grep '^exit=' "$log.out"), $reports report(s) (expected 1), entries counted ${entries:-0}"
        }
    done
    if [ "${GPU_EXAMPLES_ONLY:-}" = quick ]; then
        echo "$passed passed, $failed failed (GPU_EXAMPLES_ONLY=quick: the other checks were not run)"
        exit
    fi

    # A kernel that uses its module's __constant__ and __device__ variables: the
    # instrumented copy sees what the host wrote before each launch and its atomic
    # counter reaches the host's cudaMemcpyFromSymbol (the program checks every element
    # and the counter), and every thread is counted.
    log=$work/counter-module-vars
    run "$log" --attach kernel_entry=scaledAdd --attach kernel_exit=scaledAdd "$objs/cuda_counter.bpf.o" -- "$cuda/module_vars" $n 5
    entries=$(value "$log.out" counts 0) exits=$(value "$log.out" counts 1)
    ok=0
    grep -q "counted=$((n * 5)) check=ok" "$log.out" && grep -q '^exit=0' "$log.out" &&
        [ "$entries" = $((n * 5)) ] && [ "$exits" = $((n * 5)) ] && ok=1
    result "cuda_counter on a kernel using its module's variables" $ok "$(grep -o 'counted=[0-9]* check=[a-z]*' "$log.out" | head -1), entries $entries exits $exits (expected $((n * 5)) each)"

    # A CUDA graph (two vectorAdd nodes captured from a stream after a warm-up launch)
    # replayed: the nodes run the instrumented kernel, every thread of every node of every
    # replay counted (plus the warm-up's).
    log=$work/counter-graph
    run "$log" "$objs/cuda_counter.bpf.o" -- "$cuda/graph_add" $n $iters 256 1
    entries=$(value "$log.out" counts 0) exits=$(value "$log.out" counts 1)
    expect=$((n * iters * 2 + n))
    ok=0
    # nodes: the application's two, and the per-SM folds captured after each.
    grep -q 'nodes=4 .*check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
        [ "$entries" = $expect ] && [ "$exits" = $expect ] && ok=1
    result "cuda_counter on a CUDA graph (2 nodes, $iters replays, a warm-up launch)" $ok "entries $entries exits $exits (expected $expect each)"
    # Captured with no launch before: the capture must stay valid and the graph run as
    # built, uninstrumented, with a notice saying why.
    log=$work/counter-graph-cold
    run "$log" "$objs/cuda_counter.bpf.o" -- "$cuda/graph_add" 65536 3 256 0
    ok=0
    grep -q 'nodes=2 .*check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
        grep -q 'before its instrumented module was ready' "$log.out" && ok=1
    result "a CUDA graph captured before its first launch: capture valid, a notice" $ok "$(grep -o 'check=[a-z]*' "$log.out" | head -1), $(grep -c 'before its instrumented module was ready' "$log.out") notice"
    # Launch events of a CUDA graph's kernel nodes: each replay of the graph is one call
    # for two kernels; each node gets its launch program's run at the graph's launch and
    # again with its own GPU times (event-record nodes put around it when the graph is
    # instantiated), as a launch of its own would. With a warm-up launch before the
    # capture (21 kernel runs) and without (20); the capture stays valid either way.
    for warm in 1 0; do
        log=$work/launch-graph-$warm
        run "$log" "$objs/launchsnoop.bpf.o" -- "$cuda/graph_add" $n $iters 256 $warm
        expect=$((2 * iters + warm))
        calls=$(value "$log.out" stats 0) done=$(value "$log.out" stats 1)
        max=$(value "$log.out" stats 3) early=$(value "$log.out" stats 5)
        threads=$(value "$log.out" stats 6) launch_failed=$(value "$log.out" stats 7)
        orphan=$(value "$log.out" stats 8) bound=$(value "$log.out" stats 9)
        events=$(grep '^event events ' "$log.out" | grep -c -e 'vectorAdd' -e '76 65 63 74 6f 72 41 64 64')
        ms_max=$(field "$log.out" ms_max)
        ok=0
        grep -q 'nodes=2 .*check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
            [ "$calls" = $expect ] && [ "$done" = $expect ] && [ "$threads" = $((n * expect)) ] &&
            [ "$early" = 0 ] && [ "$launch_failed" = 0 ] && [ "$orphan" = 0 ] && [ "$events" = $expect ] &&
            awk -v m="${max:-0}" -v l="$ms_max" -v b="${bound:-0}" 'BEGIN { exit !(m > 0 && m <= l * 1e6 + b) }' && ok=1
        result "launch events of a CUDA graph's kernel nodes (warm-up $warm)" $ok "$calls calls, $done completed, $events events naming vectorAdd (expected $expect each), $threads threads; longest GPU time $max ns <= the app's longest graph launch $ms_max ms; $early before their call, $orphan completions without a call run; $(grep -o 'check=[a-z]*' "$log.out" | head -1)"
    done

    # threadhist: 256 blocks of 256 threads, 3 launches: 768 exits at every index below 256.
    log=$work/threadhist
    run "$log" "$objs/threadhist.bpf.o" -- "$cuda/vec_add" 65536 3 256
    bad=0
    for i in $(seq 0 255); do
        [ "$(value "$log.out" exits_by_thread $i)" = 768 ] || bad=$((bad + 1))
    done
    beyond=$(sed -n 's/^exits_by_thread\[\([0-9]*\)\]: .*/\1/p' "$log.out" | awk '$1 >= 256' | wc -l)
    ok=0; [ $bad = 0 ] && [ "$beyond" = 0 ] && grep -q 'check=ok' "$log.out" && ok=1
    result "threadhist: exits by threadIdx.x" $ok "$bad of 256 indices off 768, $beyond entries past 255"

    # kernelretsnoop: one ring buffer record per thread, each carrying n (PT_REGS_PARM4).
    log=$work/kretsnoop
    run "$log" "$objs/kernelretsnoop.bpf.o" -- "$cuda/vec_add" 4096 2 256
    events=$(grep -c '^event events 24B' "$log.out")
    wrong_n=$(grep '^event events 24B' "$log.out" | grep -vc '00 10 00 00\]$')
    ok=0; [ "$events" = 8192 ] && [ "$wrong_n" = 0 ] && ok=1
    result "kernelretsnoop: a ring buffer event per thread with the kernel's argument n" $ok "$events events (expected 8192), $wrong_n with n != 4096"
    # The same records through a perf event array (bpf_perf_event_output on the GPU). As
    # the kernel's, a perf sample's size is padded so that it and its u32 length end on
    # 8 bytes: 24 bytes come as 28, the last 4 zero.
    log=$work/kretsnoop-perf
    run "$log" "$objs/kernelretsnoop_perf.bpf.o" -- "$cuda/vec_add" 4096 2 256
    events=$(grep -c '^event events 28B' "$log.out")
    wrong_n=$(grep '^event events 28B' "$log.out" | grep -vc '00 10 00 00 00 00 00 00\]$')
    ok=0; [ "$events" = 8192 ] && [ "$wrong_n" = 0 ] && grep -q 'check=ok' "$log.out" && ok=1
    result "kernelretsnoop through a perf event array: an event per thread with the kernel's argument n" $ok "$events events (expected 8192), $wrong_n with n != 4096"

    # launchlate: a CPU uprobe and a GPU probe share a map; launch-to-start latency on one
    # clock, each launch seen on both sides.
    log=$work/launchlate
    run "$log" "$objs/launchlate.bpf.o" -- "$cuda/vec_add" 1048576 20
    cpu=$(value "$log.out" stats 0) gpu=$(value "$log.out" stats 1)
    sum=$(value "$log.out" stats 2) early=$(value "$log.out" stats 3)
    ms_max=$(field "$log.out" ms_max)
    mean=$(awk -v s="${sum:-0}" -v g="${gpu:-0}" -v e="${early:-0}" 'BEGIN { if (g - e > 0) printf "%.0f", s / (g - e); else print 0 }')
    ok=0
    [ "$cpu" = 20 ] && [ "$gpu" = 20 ] && [ "${mean:-0}" -gt 0 ] &&
        awk -v m="$mean" -v l="$ms_max" 'BEGIN { exit !(m <= l * 1e6) }' &&
        grep -q 'check=ok' "$log.out" && ok=1
    result "launchlate: CPU uprobe and GPU probe share a map, one clock" $ok "$cpu launches on the CPU, $gpu starts on the GPU (expected 20 each), mean launch-to-start ${mean} ns (<= longest launch ${ms_max} ms), ${early:-?} started before the CPU's stamp (clock error)"
    grep -A12 '^latency_hist' "$log.out" | sed 's/^/    /'

    # bpftime's GPU arrays (map type 1503) shared by a CPU uprobe on the CUDA runtime's
    # launch call and a GPU entry probe, as bpftime's launchlate shares them: launchlate
    # with its three maps declared as 1503 (launchlate_gpu.bpf.o), on static cudart (the
    # uprobe found in the binary) and shared cudart (found in libcudart.so.13): each of the
    # 20 launches counted on both sides, through the one copy of the map, and the maps
    # printed as the GPU arrays they were made.
    for app in vec_add vec_add_shared; do
        log=$work/launchlate-gpu-$app
        attach=()
        [ $app = vec_add_shared ] && attach=(--attach launch=libcudart.so.13:__cudaLaunchKernel)
        run "$log" "${attach[@]}" "$objs/launchlate_gpu.bpf.o" -- "$cuda/$app" 1048576 20
        cpu=$(value "$log.out" stats 0) gpu=$(value "$log.out" stats 1)
        sum=$(value "$log.out" stats 2) early=$(value "$log.out" stats 3)
        ms_max=$(field "$log.out" ms_max)
        mean=$(awk -v s="${sum:-0}" -v g="${gpu:-0}" -v e="${early:-0}" 'BEGIN { if (g - e > 0) printf "%.0f", s / (g - e); else print 0 }')
        typed=$(grep -c '^\(stats\|launched\) (gpu_array ' "$log.out")
        ok=0
        [ "$cpu" = 20 ] && [ "$gpu" = 20 ] && [ "${mean:-0}" -gt 0 ] && [ "$typed" = 2 ] &&
            awk -v m="$mean" -v l="$ms_max" 'BEGIN { exit !(m <= l * 1e6) }' &&
            grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" && ok=1
        result "launchlate on bpftime's GPU arrays (1503), $app: CPU uprobe and GPU probe share one copy" $ok "$cpu launches on the CPU, $gpu starts on the GPU (expected 20 each), mean launch-to-start ${mean} ns (<= longest launch ${ms_max} ms), $typed of 2 maps shown as gpu_array"
    done

    # gpu_maps: bpftime's GPU map types, read by a loader of ours (an unmodified libbpf
    # C tool under `bpftime load`) as bpftime's users read them, with vectorAdd under
    # `bpftime start`: 8 blocks of 128 threads (1024, the per-thread array's and the
    # ring's default thread count), 5 launches, n = 1024. Per thread (1502, a plain
    # read-and-write in each thread's own copy): 5 calls each, and each thread's own
    # global id + 1 at its place in bpf()'s answer (ids_in_order 1024); the GPU array
    # (1503): 5120 entries and exits, n summed 5120 x 1024; the GPU hash map (1501): 8
    # keys (blockIdx.x % 8) of 640 each; the GPU ring buffer (1527, bpf_perf_event_output
    # with a NULL context): 5120 records of 24 bytes, 5 from each of the 1024 threads,
    # every field as written, through bpftime's poll function (found with dlsym) and,
    # again, through libbpf's ring buffer API and its perf buffer API (with
    # BPFTIME_GPU_RING_AS=perf; nothing lost). Static and shared cudart.
    gpu_maps_check() {  # gpu_maps_check APP READER
        local app=$1 reader=$2 n=1024 iters=5 block=128
        local store=gpu-ex-$$-maps-$app-$reader d=$work/gpu-maps-$app-$reader tool i status
        # libbpf's perf buffer API takes the ring only where the shim shows it as a perf
        # event array (BPFTIME_GPU_RING_AS=perf); the others read it as a ring buffer.
        local ring_as=ringbuf
        [ "$reader" = perf ] && ring_as=perf
        BPFTIME_GPU_RING_AS=$ring_as GPU_MAPS_READER=$reader LD_LIBRARY_PATH="$objs" "$bt" --store "$store" load "$objs/gpu_maps" \
            --obj "$objs/gpu_maps.bpf.o" >"$d.tool" 2>&1 &
        tool=$!
        for i in $(seq 600); do grep -qx ready "$d.tool" && break; sleep 0.05; done
        timeout 300 "$bt" --store "$store" start "$cuda/$app" $n $iters $block >"$d.app" 2>&1
        status=$?
        # The app's last records reach the store's ring as it exits; a perf buffer gets
        # them through a thread of the shim's. Half a second for them to arrive, then
        # the counts come at SIGINT; a loader that does not go is killed, its counts missing.
        sleep 0.5
        kill -INT $tool 2>/dev/null
        for i in $(seq 200); do kill -0 $tool 2>/dev/null || break; sleep 0.05; done
        kill -KILL $tool 2>/dev/null
        wait $tool 2>/dev/null
        rm -rf "/dev/shm/bpftime-$(id -u)-$store"
        cat "$d.tool" "$d.app" >"$logs/gpu-maps-$app-$reader.out" 2>/dev/null
        local threads=$((n / block * block)) launched=$((n / block * block * iters))
        local want_pt="per_thread threads=$threads calls_min=$iters calls_max=$iters calls_zero=0 ids_in_order=$threads"
        local want_totals="totals entries=$launched elements=$((launched * n)) exits=$launched refused=0"
        local want_hash="by_block keys=8 min=$((launched / 8)) max=$((launched / 8)) sum=$launched"
        local want_events="events reader=$reader records=$launched size_bad=0 field_bad=0 threads=$threads per_thread_min=$iters per_thread_max=$iters poll_errors=0"
        local ok=0
        [ $status = 0 ] && grep -q 'check=ok' "$d.app" && grep -qx "$want_pt" "$d.tool" &&
            grep -qx "$want_totals" "$d.tool" && grep -qx "$want_hash" "$d.tool" &&
            grep -qx "$want_events" "$d.tool" && ok=1
        # Through perf buffers: nothing lost on the way either.
        [ "$reader" != perf ] || grep -qx 'perf lost=0' "$d.tool" || ok=0
        result "gpu_maps on $app, ring read through $reader: per-thread values, GPU array and hash sums, every ring record" $ok "app exit $status $(grep -o 'check=[a-z]*' "$d.app" | head -1); $(grep -E '^(per_thread|totals|by_block|events|perf) ' "$d.tool" | tr '\n' ';') (expected: $want_pt; $want_totals; $want_hash; $want_events)"
    }
    gpu_maps_check vec_add poll
    gpu_maps_check vec_add_shared poll
    gpu_maps_check vec_add ringbuf
    gpu_maps_check vec_add_shared perf

    # The same object under `bpftime run`, which reads the GPU ring buffer through
    # libbpf's ring buffer (its info says ring buffer) and prints every map: each thread's
    # values as runs (`0-1023=5`), the GPU array's and hash map's values.
    log=$work/gpu-maps-run
    run "$log" "$objs/gpu_maps.bpf.o" -- "$cuda/vec_add" 1024 5 128
    records=$(grep -c '^event events 24B' "$log.out")
    ok=0
    grep -qx 'per_thread\[0\]: 0-1023=5' "$log.out" && grep -q '^per_thread\[1\]: 0=1 1=2 2=3 ' "$log.out" &&
        [ "$(value "$log.out" totals 0)" = 5120 ] && [ "$(value "$log.out" totals 2)" = 5120 ] &&
        [ "$(value "$log.out" totals 1)" = $((5120 * 1024)) ] && [ "$(grep -c '^by_block\[[0-7]\]: 640$' "$log.out")" = 8 ] &&
        [ "$records" = 5120 ] && grep -q '^events (gpu_ringbuf): 5120 events' "$log.out" &&
        grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" && ok=1
    result "gpu_maps under bpftime run: every map printed, the GPU ring read through libbpf's ring buffer" $ok "$(grep -E '^per_thread\[0\]|^totals\[[012]\]|^events \(' "$log.out" | tr '\n' ';') $records records of 24 bytes (expected 5120), $(grep -c '^by_block\[[0-7]\]: 640$' "$log.out") of 8 hash keys at 640"

    # hashcount: every thread of every launch races to insert the same 64 hash keys.
    log=$work/hashcount
    run "$log" "$objs/hashcount.bpf.o" -- "$cuda/vec_add" 1048576 10 256
    keys=$(grep -c '^by_lane\[' "$log.out")
    off=$(sed -n 's/^by_lane\[[0-9]*\]: \([0-9]*\)$/\1/p' "$log.out" | grep -vcx 163840)
    ok=0; [ "$keys" = 64 ] && [ "$off" = 0 ] && grep -q 'check=ok' "$log.out" && ok=1
    result "hashcount: concurrent inserts of one key make one entry" $ok "$keys keys (expected 64), $off not holding 1048576 / 64 x 10 = 163840"

    # lru_hashcount: LRU hash maps on the GPU, one never full (exact counts, as hashcount)
    # and one that a key per thread keeps full (every update succeeds, by eviction).
    log=$work/lru_hashcount
    run "$log" "$objs/lru_hashcount.bpf.o" -- "$cuda/vec_add" 1048576 10 256
    keys=$(grep -c '^by_lane\[' "$log.out")
    off=$(sed -n 's/^by_lane\[[0-9]*\]: \([0-9]*\)$/\1/p' "$log.out" | grep -vcx 163840)
    recent=$(grep -c '^recent\[' "$log.out")
    recent_pc=$(grep -c '^recent_percpu\[' "$log.out")
    updated=$(value "$log.out" outcome 0) refused=$(value "$log.out" outcome 1)
    updated_pc=$(value "$log.out" outcome 2) refused_pc=$(value "$log.out" outcome 3)
    ok=0
    [ "$keys" = 64 ] && [ "$off" = 0 ] && [ "$updated" = 10485760 ] && [ "${refused:-0}" = 0 ] &&
        [ "$updated_pc" = 10485760 ] && [ "${refused_pc:-0}" = 0 ] &&
        [ "$recent" -gt 0 ] && [ "$recent" -le 1024 ] && [ "$recent_pc" -gt 0 ] && [ "$recent_pc" -le 1024 ] &&
        grep -q 'check=ok' "$log.out" && ok=1
    result "lru_hashcount: LRU hash maps on the GPU count as hash maps until full, then evict" $ok "$keys keys (expected 64), $off not holding 163840; updates of a full LRU map: $updated succeeded (expected 10485760), ${refused:-0} failed, it holds $recent keys (at most 1024); per-CPU: $updated_pc succeeded, ${refused_pc:-0} failed, $recent_pc keys"

    # hashstarts: start times in a hash map, inserted at entry and deleted at exit, over 50
    # launches of 256 threads: 12800 deletes leave tombstones in a table of 2048 slots,
    # which is laid out anew between launches, so no insert fails.
    log=$work/hashstarts
    run "$log" "$objs/hashstarts.bpf.o" -- "$cuda/vec_add" 256 50 256
    ins=$(value "$log.out" outcome 0) ins_failed=$(value "$log.out" outcome 1)
    found=$(value "$log.out" outcome 2) lost=$(value "$log.out" outcome 3)
    left=$(grep -c '^starts\[' "$log.out")
    ok=0
    [ "$ins" = 12800 ] && [ "${ins_failed:-0}" = 0 ] && [ "$found" = 12800 ] && [ "${lost:-0}" = 0 ] &&
        [ "$left" = 0 ] && grep -q 'check=ok' "$log.out" && ok=1
    result "hashstarts: a hash map's deleted slots do not run it out of room across launches" $ok "inserts $ins (expected 12800), $ins_failed failed; exits that found their start $found (expected 12800), $lost did not; $left keys left (expected 0)"

    # smcount: a per-CPU array on the GPU (a value per SM), summed over CPUs by the tool,
    # against an array indexed by SM id.
    log=$work/smcount
    run "$log" "$objs/smcount.bpf.o" -- "$cuda/vec_add" 1048576 10 256
    total=$(value "$log.out" exits 0)
    by_sm=$(sed -n 's/^by_sm\[[0-9]*\]: \([0-9]*\)$/\1/p' "$log.out" | awk '{ s += $1 } END { print s + 0 }')
    sms=$(sed -n 's/^by_sm\[[0-9]*\]: \([0-9]*\)$/\1/p' "$log.out" | grep -vc '^0$')
    ok=0; [ "$total" = 10485760 ] && [ "$by_sm" = 10485760 ] && [ "$sms" -gt 1 ] && grep -q 'check=ok' "$log.out" && ok=1
    result "smcount: a per-CPU array keeps a value per SM, summed over CPUs" $ok "per-CPU sum $total, by SM $by_sm (expected 10485760 each), over $sms SMs"

    # percpu_hashcount: per-CPU hash maps on the GPU (a value per key and SM), summed over
    # CPUs by the tool, on every kind of build. by_lane: every thread races to insert the
    # same 64 keys, each N / 64 x ITERS over CPUs. from_cpu[0]: made by the CPU (a launch
    # program) after the first launch call with 1000000, found and added to by every
    # thread of every later launch. seen[k]: threads that saw the CPU's launch count k
    # (written on the CPU between launches) on the SM its CPU's values go to: every k
    # below ITERS is seen (launch k+1 sees k), ITERS never.
    n=1048576 iters=10
    for app in "vec_add" "vec_add_shared" "vec_add_driver $cuda/vec_add.ptx"; do
        set -- $app
        log=$work/percpu-hash-$1
        exe=$cuda/$1; shift
        run "$log" "$objs/percpu_hashcount.bpf.o" -- "$exe" "$@" $n $iters 256
        keys=$(grep -c '^by_lane\[' "$log.out")
        off=$(sed -n 's/^by_lane\[[0-9]*\]: \([0-9]*\)$/\1/p' "$log.out" | grep -vcx $((n / 64 * iters)))
        made=$(value "$log.out" from_cpu 0)
        unseen=0
        for k in $(seq 1 $((iters - 1))); do
            got=$(value "$log.out" seen $k)
            [ "${got:-0}" -gt 0 ] || unseen=$((unseen + 1))
        done
        early=$(value "$log.out" seen $iters)
        ok=0
        grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
            [ "$keys" = 64 ] && [ "$off" = 0 ] && [ "$made" = $((1000000 + n * (iters - 1))) ] &&
            [ "$unseen" = 0 ] && [ "${early:-0}" = 0 ] && ok=1
        result "percpu_hashcount on $app: per-CPU hash on the GPU, summed over CPUs, CPU writes seen by later launches" $ok "$keys keys (expected 64), $off not holding $n / 64 x $iters = $((n / 64 * iters)); from_cpu[0] $made (expected 1000000 + $n x $((iters - 1)) = $((1000000 + n * (iters - 1)))); CPU launch counts 1..$((iters - 1)) unseen by later launches: $unseen, count $iters seen before it was written: ${early:-0}"
    done

    several_gpus

    # Memory-access probes (`cuda:KERNEL:ldst`), exact against a count by hand:
    # vectorAdd over n elements loads n floats from a and n from b and stores n into c;
    # the tiled matmul loads n^3/16 from each of a and b (one per tile step per thread)
    # and stores n^2; nothing falls outside the three buffers, every access is 4 bytes.
    ldst() {  # ldst NAME MAP LOADS STORES ARGS...
        local name=$1 map=$2 loads=$3 stores=$4
        shift 4
        log=$work/ldst-$name
        run "$log" "$objs/access_check.bpf.o" -- "$@"
        local la lb sc other outside size all
        la=$(value "$log.out" "$map" 0) lb=$(value "$log.out" "$map" 1) sc=$(value "$log.out" "$map" 2)
        other=$(value "$log.out" "$map" 3) outside=$(value "$log.out" "$map" 4)
        size=$(value "$log.out" "$map" 5) all=$(value "$log.out" "$map" 6)
        ok=0
        if grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
            [ "$la" = "$loads" ] && [ "$lb" = "$loads" ] && [ "$sc" = "$stores" ] &&
            [ "$other" = 0 ] && [ "$outside" = 0 ] && [ "$size" = 0 ] &&
            [ "$all" = $((2 * loads + stores)) ]; then
            ok=1
        fi
        result "memory-access probe on $name, exact" $ok "loads a $la b $lb (expected $loads each), stores c $sc (expected $stores), elsewhere $outside, other kinds $other, not 4 bytes $size"
    }
    n=1048576
    ldst "vectorAdd (static cudart)" vector_add $((n * 3)) $((n * 3)) "$cuda/vec_add" $n 3
    ldst "vectorAdd (driver API, PTX)" vector_add $((n * 3)) $((n * 3)) "$cuda/vec_add_driver" "$cuda/vec_add.ptx" $n 3
    # a and b read by asynchronous copies into shared memory (`cp.async`, checked to be
    # in the PTX), each a 4-byte load of global memory.
    if grep -q 'cp.async.ca.shared.global' "$cuda/vec_add_async.ptx"; then
        ldst "vectorAdd through asynchronous copies (cp.async)" vector_add $((n * 3)) $((n * 3)) "$cuda/vec_add_async" $n 3
    else
        result "memory-access probe on vectorAdd through asynchronous copies" 0 "no cp.async in $cuda/vec_add_async.ptx"
    fi
    # a and b read and c written by bulk copies (the tensor memory accelerator's
    # cp.async.bulk; checked to be in the PTX): a block of 256 threads moves 1024 bytes
    # of each with one copy issued by one thread, c back by a bulk store in even blocks
    # and a bulk reduction (.and, which leaves a + b in c) in odd ones. Each copy is one
    # access of its whole size: blocks x launches loads in a and in b, half as many stores
    # and reductions in c, and every byte of the three buffers moved once per launch.
    if grep -q 'cp.async.bulk.shared::cluster.global' "$cuda/vec_add_bulk.ptx" &&
        grep -q 'cp.reduce.async.bulk.global' "$cuda/vec_add_bulk.ptx"; then
        bulk_iters=3 bulk_blocks=$((n / 256))
        log=$work/ldst-bulk
        run "$log" "$objs/access_check.bpf.o" -- "$cuda/vec_add_bulk" $n $bulk_iters
        la=$(value "$log.out" vector_add 0) lb=$(value "$log.out" vector_add 1) sc=$(value "$log.out" vector_add 2)
        other=$(value "$log.out" vector_add 3) outside=$(value "$log.out" vector_add 4) all=$(value "$log.out" vector_add 6)
        ba=$(value "$log.out" vector_add_bytes 0) bb=$(value "$log.out" vector_add_bytes 1)
        bs=$(value "$log.out" vector_add_bytes 2) br=$(value "$log.out" vector_add_bytes 3) bo=$(value "$log.out" vector_add_bytes 4)
        want=$((bulk_blocks * bulk_iters)) bytes=$((n * 4 * bulk_iters))
        ok=0
        grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
            [ "$la" = $want ] && [ "$lb" = $want ] && [ "$sc" = $((want / 2)) ] &&
            [ "$other" = $((want / 2)) ] && [ "$outside" = 0 ] && [ "$all" = $((want * 3)) ] &&
            [ "$ba" = $bytes ] && [ "$bb" = $bytes ] && [ "$bs" = $((bytes / 2)) ] &&
            [ "$br" = $((bytes / 2)) ] && [ "$bo" = 0 ] && ok=1
        result "memory-access probe on vectorAdd through bulk copies (cp.async.bulk, cp.reduce.async.bulk), exact" $ok "copies: loads a $la b $lb (expected $want each), stores c $sc and reductions c $other (expected $((want / 2)) each), elsewhere $outside, all $all (expected $((want * 3))); bytes: a $ba b $bb (expected $bytes each), stored $bs reduced $br (expected $((bytes / 2)) each), other $bo"
    else
        result "memory-access probe on vectorAdd through bulk copies" 0 "no cp.async.bulk or cp.reduce.async.bulk in $cuda/vec_add_bulk.ptx"
    fi
    # Tensor copies (cp.async.bulk.tensor.2d, tile mode): tma_copy doubles a 1000 x 500
    # float tensor in 32 x 16 tiles, each loaded into shared memory and stored back by a
    # tensor copy, the tiles of the last column and row hanging over the tensor's edges.
    # The copies' global addresses are in tensor maps (cuTensorMapEncodeTiled, seen on the
    # host); each box row inside the tensor is one access of its bytes: per launch 32
    # columns of tiles x 500 rows loaded and as many stored, 1000 x 500 x 4 bytes each
    # way, all inside `in` and `out`, with nothing missed said.
    if cuobjdump -ptx "$cuda/tma_copy" 2>/dev/null | grep -q 'cp.async.bulk.tensor.2d'; then
        tma_iters=3
        log=$work/ldst-tensor
        run "$log" "$objs/tensor_copies.bpf.o" -- "$cuda/tma_copy" $tma_iters
        rl=$(value "$log.out" tensor_copies 0) bl=$(value "$log.out" tensor_copies 1)
        rs=$(value "$log.out" tensor_copies 2) bs=$(value "$log.out" tensor_copies 3)
        bad=$(value "$log.out" tensor_copies 4) all=$(value "$log.out" tensor_copies 5)
        rows=$((32 * 500 * tma_iters)) bytes=$((1000 * 500 * 4 * tma_iters))
        ok=0
        grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" && ! grep -q 'miss' "$log.out" &&
            [ "$rl" = $rows ] && [ "$rs" = $rows ] && [ "$bl" = $bytes ] && [ "$bs" = $bytes ] &&
            [ "$bad" = 0 ] && [ "$all" = $((rows * 2)) ] && ok=1
        result "memory-access probe on tensor copies (cp.async.bulk.tensor), a row each, exact" $ok "rows loaded $rl stored $rs (expected $rows each), bytes loaded $bl stored $bs (expected $bytes each), elsewhere or misshapen $bad, all $all"
    else
        result "memory-access probe on tensor copies" 0 "no cp.async.bulk.tensor in $cuda/tma_copy's PTX"
    fi
    n=512
    ldst "matmul" matmul $((n * n * n / 16 * 2)) $((n * n * 2)) "$cuda/matmul" $n 2

    # Shared-memory access probes (`cuda:KERNEL:ldst.shared`), exact against a count by
    # hand on the tiled matmul and vectorAdd: scripts/gpu-ldst-shared.sh (which runs
    # alone too), its lines counted here.
    while IFS= read -r line; do
        case $line in
        "PASS "*) passed=$((passed + 1)); echo "$line" ;;
        "FAIL "*) failed=$((failed + 1)); echo "$line" ;;
        *" passed, "*" failed") ;;
        *) echo "$line" ;;
        esac
    done < <(bash scripts/gpu-ldst-shared.sh "$bt" "$objs" "$cuda" 2>&1)

    # memtrace: counts per kernel and kind, offsets within each buffer as log2
    # histograms, and a timeline PNG of sampled accesses (kept beside the results). Both
    # kernels take (a, b, c, ...) and read a and b alike: every load lands in the
    # histogram of a or of b, half each, every store in c's, none elsewhere.
    keep=$(dirname "$out")
    # The timeline's words need a TrueType font: where the system has none that bpftime
    # finds, matplotlib's own DejaVu Sans.
    if [ -z "${BPFTIME_FONT:-}" ] && ! fc-match -f '%{file}' sans-serif >/dev/null 2>&1 &&
        [ ! -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
        font=$(python3 -c 'import matplotlib, os; print(os.path.join(matplotlib.get_data_path(), "fonts/ttf/DejaVuSans.ttf"))' 2>/dev/null || true)
        if [ -n "$font" ] && [ -e "$font" ]; then export BPFTIME_FONT=$font; fi
    fi
    memtrace() {  # memtrace NAME LOADS STORES APP ARGS...
        local name=$1 loads=$2 stores=$3
        shift 3
        log=$work/memtrace-$name
        run "$log" --out "$work/memtrace-$name.d" "$objs/memtrace.bpf.o" -- "$@"
        cp "$work/memtrace-$name.d/timeline.png" "$keep/memtrace-$name.png" 2>/dev/null
        cp "$work/memtrace-$name.d/maps.txt" "$keep/memtrace-$name.maps.txt" 2>/dev/null
        local slot got_loads got_stores maps="$work/memtrace-$name.d/maps.txt" h0 h1 h2 h_rest
        # accesses[128 * kind + slot] (loads kind 0, stores 1); kernels[slot] names it.
        slot=$(sed -n 's/^kernels\[\([0-9]*\)\]: .*name=.*/\1/p' "$log.out" | head -1)
        got_loads=$(value "$log.out" accesses "${slot:-x}")
        got_stores=$(value "$log.out" accesses "$((128 + ${slot:-0}))")
        h0=$(hist_sum "$maps" offset_hist_arg0) h1=$(hist_sum "$maps" offset_hist_arg1)
        h2=$(hist_sum "$maps" offset_hist_arg2)
        h_rest=$(($(hist_sum "$maps" offset_hist_arg3) + $(hist_sum "$maps" offset_hist_arg4) + $(hist_sum "$maps" offset_hist_arg5)))
        ok=0
        if grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
            [ "$got_loads" = "$loads" ] && [ "$got_stores" = "$stores" ] &&
            [ "$h0" = $((loads / 2)) ] && [ "$h1" = $((loads / 2)) ] && [ "$h2" = "$stores" ] &&
            [ "$h_rest" = 0 ] &&
            [ -s "$work/memtrace-$name.d/timeline.png" ] && [ "$(value "$log.out" collisions 0)" = 0 ]; then
            ok=1
        fi
        result "memtrace on $name" $ok "loads $got_loads (expected $loads), stores $got_stores (expected $stores); offset histograms: a $h0 b $h1 (expected $((loads / 2)) each), c $h2 (expected $stores), other arguments $h_rest; $(grep -o 'timeline.png ([0-9]* sampled[^)]*' "$log.out" | cut -c15-)"
    }
    memtrace vectorAdd $((2 * 16777216)) 16777216 "$cuda/vec_add" 16777216 1
    memtrace matmul $((2 * 1024 * 1024 * 1024 / 16)) $((1024 * 1024)) "$cuda/matmul" 1024 1
    # 400 launches: vectorAdd's second build with fewer registers (kept there: no more
    # local memory) takes the first one's place while they run, and every access is still
    # counted once, whichever build made it.
    BPFTIME_LOG=info memtrace vectorAdd-400 $((2 * 16777216 * 400)) $((16777216 * 400)) "$cuda/vec_add" 16777216 400
    refit=$(sed 's/\x1b\[[0-9;]*m//g' "$work/memtrace-vectorAdd-400.out" | grep 'built again with fewer registers' | head -1)
    swapped=$(sed 's/\x1b\[[0-9;]*m//g' "$work/memtrace-vectorAdd-400.out" | grep -c 'second build takes the first')
    ok=0; grep -q 'kept=true' <<<"$refit" && [ "$swapped" = 1 ] && ok=1
    result "memtrace: vectorAdd's second build with fewer registers takes the first one's place while 400 launches run" $ok \
        "$(grep -o 'kernels=.*kept=[a-z]*' <<<"$refit"), swapped $swapped time(s); counts in the check above"

    # launchsnoop: a launch program on every kernel, run at each launch call and again
    # once the kernel completed, with its GPU start and end on the host clock; on each
    # kind of build and on a kernel without PTX. GPU times are bracketed by the
    # application's own CUDA events, so none may exceed its longest launch; their mean is
    # at least half the app's shortest launch (the app's times also hold the host's gap
    # between its start event and the launch, which on an idle GPU is most of a median).
    n=1048576 iters=20
    for app in "vec_add" "vec_add_shared" "vec_add_driver $cuda/vec_add.ptx" "vec_add_noptx"; do
        set -- $app
        log=$work/snoop-$1
        exe=$cuda/$1; shift
        run "$log" "$objs/launchsnoop.bpf.o" -- "$exe" "$@" $n $iters
        calls=$(value "$log.out" stats 0) done=$(value "$log.out" stats 1)
        sum=$(value "$log.out" stats 2) max=$(value "$log.out" stats 3)
        early=$(value "$log.out" stats 5) threads=$(value "$log.out" stats 6)
        launch_failed=$(value "$log.out" stats 7) orphan=$(value "$log.out" stats 8)
        bound=$(value "$log.out" stats 9)
        events=$(grep -c '^event events ' "$log.out")
        # The record's name field, as text or, untyped, as hex.
        named=$(grep '^event events ' "$log.out" | grep -c -e 'vectorAdd' -e '76 65 63 74 6f 72 41 64 64')
        ms=$(field "$log.out" ms_per_launch) ms_max=$(field "$log.out" ms_max) ms_min=$(field "$log.out" ms_min)
        mean=$(awk -v s="${sum:-0}" -v d="${done:-0}" 'BEGIN { if (d) printf "%.0f", s / d; else print 0 }')
        ok=0
        grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
            [ "$calls" = $iters ] && [ "$done" = $iters ] && [ "$threads" = $((n * iters)) ] &&
            [ "$early" = 0 ] && [ "$launch_failed" = 0 ] && [ "$orphan" = 0 ] &&
            [ "$events" = $iters ] && [ "$named" = $iters ] &&
            awk -v m="${max:-0}" -v l="$ms_max" -v b="${bound:-0}" 'BEGIN { exit !(m > 0 && m <= l * 1e6 + b) }' &&
            [ -n "$ms_min" ] && awk -v a="$mean" -v l="$ms_min" 'BEGIN { exit !(a >= 0.5 * l * 1e6) }' && ok=1
        result "launchsnoop on $app" $ok "$calls calls, $done completed (expected $iters each), $threads threads (expected $((n * iters))), $events events naming vectorAdd: $named; GPU time mean $mean ns, longest $max ns vs the app's CUDA events: median $ms ms, shortest $ms_min ms, longest $ms_max ms; clock bound $bound ns; $early before their call, $orphan completions without a call run"
    done

    # CuPy's RawKernel (NVRTC at run time, cuModuleLoadData). CuPy 14 loads a cubin, so by
    # default the kernel gets one notice (naming CuPy's switch) and runs as it is; with
    # CUPY_COMPILE_WITH_PTX=1 it carries PTX, and threadhist's exit probe counts it:
    # 256 blocks of 256 threads, 3 launches, 768 exits at every index.
    if python3 -c 'import cupy' 2>/dev/null; then
        log=$work/cupy-cubin
        run "$log" "$objs/threadhist.bpf.o" -- python3 bpf-examples/cuda/cupy_add.py 65536 3
        notices=$(grep -c '^bpftime: kernel vectorAdd has no PTX.*CUPY_COMPILE_WITH_PTX=1' "$log.out")
        ok=0; grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" && [ "$notices" = 1 ] && ok=1
        result "CuPy RawKernel as a cubin: one notice naming the switch, the app runs" $ok "$notices notices"
        log=$work/cupy-ptx
        CUPY_COMPILE_WITH_PTX=1 run "$log" "$objs/threadhist.bpf.o" -- python3 bpf-examples/cuda/cupy_add.py 65536 3
        bad=0
        for i in $(seq 0 255); do
            [ "$(value "$log.out" exits_by_thread $i)" = 768 ] || bad=$((bad + 1))
        done
        ok=0; [ $bad = 0 ] && grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" && ok=1
        result "CuPy RawKernel with PTX: threadhist inside a kernel NVRTC compiled" $ok "$bad of 256 indices off 768"
    else
        result "CuPy RawKernel" 0 "no CuPy on this machine"
    fi

    # launchsnoop on a PyTorch training loop (the stock wheel: no PTX anywhere): a launch
    # event for every kernel torch.profiler (CUPTI) saw in the same run, each completed,
    # GPU times summing to the profiler's within launch overheads, and the same loss as
    # a run without bpftime.
    if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        native=$(python3 bpf-examples/cuda/train.py 20 2>&1 | grep '^train')
        log=$work/torch
        run "$log" "$objs/launchsnoop.bpf.o" -- python3 bpf-examples/cuda/train.py 20
        kernels=$(field "$log.out" kernels) kus=$(field "$log.out" kernel_us)
        calls=$(value "$log.out" stats 0) done=$(value "$log.out" stats 1)
        sum=$(value "$log.out" stats 2) early=$(value "$log.out" stats 5)
        orphan=$(value "$log.out" stats 8)
        loss=$(grep -o 'loss=[0-9.]*' "$log.out" | head -1)
        loss_native=$(grep -o 'loss=[0-9.]*' <<<"$native")
        ok=0
        grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
            [ -n "$kernels" ] && [ "$kernels" -gt 0 ] && [ "$calls" = "$kernels" ] && [ "$done" = "$calls" ] &&
            [ "$early" = 0 ] && [ "$orphan" = 0 ] && [ "$loss" = "$loss_native" ] &&
            awk -v s="${sum:-0}" -v k="${kus:-0}" -v c="${calls:-0}" 'BEGIN { exit !(s >= 0.9 * k * 1e3 && s <= k * 1e3 + c * 50e3) }' && ok=1
        result "launchsnoop on PyTorch (no PTX)" $ok "$calls launch calls, $done completed, profiler saw $kernels kernels; GPU time $(awk -v s="${sum:-0}" 'BEGIN { printf "%.1f", s / 1e3 }') us vs profiler $kus us; $loss (without bpftime: $loss_native)"
    else
        result "launchsnoop on PyTorch (no PTX)" 0 "no PyTorch with CUDA on this machine"
    fi

    # GPU flame graph (`bpftime start --gpu-flamegraph`): two_paths launches one kernel from
    # two CPU call paths; each path's stacks end in `[gpu] scale`, under main, with the GPU
    # time the program's own CUDA events measured for that path's launches. The graph is
    # kept beside the results.
    keep=$(dirname "$out")
    flame() {  # flame NAME ARGS...: bpftime start --gpu-flamegraph $work/NAME ARGS
        local name=$1
        shift
        timeout 300 "$bt" --store "gpu-ex-$$" start --gpu-flamegraph "$work/$name" "$@" >"$work/$name.out" 2>&1
        echo "exit=$?" >>"$work/$name.out"
        cp "$work/$name.out" "$logs/flame-$name.out" 2>/dev/null
        cp "$work/$name.svg" "$keep/flamegraph-$name.svg" 2>/dev/null
        cp "$work/$name.folded" "$keep/flamegraph-$name.folded" 2>/dev/null
        cp "$work/$name.pb.gz" "$keep/flamegraph-$name.pb.gz" 2>/dev/null
    }
    flame two_paths "$cuda/two_paths" 20
    folded=$work/two_paths.folded
    detail="" ok=1
    grep -q 'check=ok' "$work/two_paths.out" && grep -q '^exit=0' "$work/two_paths.out" || ok=0
    [ -s "$folded" ] || ok=0
    # Every stack ends in the one kernel, and none goes through both paths (a third,
    # warm_up, launches once before the timed launches).
    [ "$(grep -vc ';\[gpu\] scale [0-9]*$' "$folded")" = 0 ] || ok=0
    [ "$(grep 'prepare_batch' "$folded" | grep -c 'train_step')" = 0 ] || ok=0
    for p in prepare_batch train_step; do
        app_ms=$(sed -n "s/^two_paths path=$p launches=20 gpu_ms=\([0-9.]*\)$/\1/p" "$work/two_paths.out")
        ns=$(grep "$p" "$folded" | awk '{ s += $NF } END { print s + 0 }')
        # main is an outer frame of the path's function.
        under_main=$(grep "$p" "$folded" | grep -c 'main;.*'"$p")
        [ "$under_main" -ge 1 ] && [ "$under_main" = "$(grep -c "$p" "$folded")" ] || ok=0
        # The program's events enclose ours (its start event is recorded before its launch
        # call reaches us, its end event after ours), so the graph's time is at most the
        # program's and short of it by at most what a launch spends before the kernel is
        # submitted (the runtime's and our own launch path; 20 us allowed per launch).
        awk -v g="$ns" -v a="${app_ms:-0}" 'BEGIN { exit !(a > 0 && g <= 1.02 * a * 1e6 && g >= a * 1e6 - 20 * 20e3 && g >= 0.5 * a * 1e6) }' || ok=0
        detail="$detail $p: $(awk -v g="$ns" 'BEGIN { printf "%.3f", g / 1e6 }') ms in the graph vs ${app_ms:-none} ms by the program's events;"
    done
    result "GPU flame graph of one kernel from two call paths" $ok "${detail% ;}$(grep -o 'of [0-9]* launches' "$work/two_paths.out" | head -1 | sed 's/^/ (/;s/$/)/')"

    # The same on the PyTorch training loop (no PTX): one launch in the graph per kernel
    # the profiler saw, stacks through libtorch, and the GPU time at least the profiler's
    # (CUPTI: kernels alone) and at most the span the program's CUDA events measured
    # around the loop (launch events are timed by CUDA events: on an idle GPU a launch's
    # time includes its launch latency, which the profiler leaves out).
    if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        flame torch python3 bpf-examples/cuda/train.py 20
        kernels=$(field "$work/torch.out" kernels) kus=$(field "$work/torch.out" kernel_us)
        span=$(field "$work/torch.out" span_us)
        launches=$(sed -n 's/.*GPU flame graph of \([0-9]*\) launches (\([0-9.]*\) ms.*/\1/p' "$work/torch.out")
        gms=$(sed -n 's/.*GPU flame graph of \([0-9]*\) launches (\([0-9.]*\) ms.*/\2/p' "$work/torch.out")
        torch_frames=$(grep -c 'at::' "$work/torch.folded" 2>/dev/null)
        ok=0
        grep -q 'check=ok' "$work/torch.out" && grep -q '^exit=0' "$work/torch.out" &&
            [ -n "$kernels" ] && [ "$launches" = "$kernels" ] && [ "${torch_frames:-0}" -gt 0 ] &&
            awk -v g="${gms:-0}" -v k="${kus:-0}" -v w="${span:-0}" 'BEGIN { exit !(g * 1e3 >= 0.9 * k && g * 1e3 <= w) }' && ok=1
        result "GPU flame graph of PyTorch (no PTX)" $ok "${launches:-no} launches in the graph, profiler saw $kernels kernels; GPU time ${gms:-none} ms, profiler's $(awk -v k="${kus:-0}" 'BEGIN { printf "%.3f", k / 1e3 }') ms, span of the loop by CUDA events $(awk -v w="${span:-0}" 'BEGIN { printf "%.3f", w / 1e3 }') ms; $(awk -v g="${gms:-0}" -v k="${kus:-0}" -v c="${launches:-1}" 'BEGIN { printf "%.1f", (g * 1e3 - k) / c }') us per launch over the profiler's; $(wc -l <"$work/torch.folded" 2>/dev/null) stacks, $torch_frames through at::"
    else
        result "GPU flame graph of PyTorch (no PTX)" 0 "no PyTorch with CUDA on this machine"
    fi

    # Python frames in the GPU flame graph: python_frames.py launches its multiply and sum
    # from <module> -> main -> outer -> middle -> inner, so a stack must read those five
    # Python frames, in order and at the script's marked lines, where the interpreter's
    # native frames were; the backward pass's kernels come from autograd's C++ thread,
    # whose stacks keep their native frames and hold no Python frame; no native frame of
    # the evaluation loop is left anywhere; and the end-of-run line names the version.
    if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        # Absolute, as CPython (3.9 and later) gives a script run by a relative path.
        script=$(pwd)/bpf-examples/cuda/python_frames.py
        flame pyframes python3 "$script" 10
        folded=$work/pyframes.folded
        at() { grep -n "# at: $1\$" "$script" | cut -d: -f1; }
        path="<module> ($script:$(at '<module>'));main ($script:$(at main));outer ($script:$(at outer));middle ($script:$(at middle));inner ($script:$(at inner));"
        forward=$(grep -cF "$path" "$folded" 2>/dev/null)
        backward=$(grep 'autograd::Engine' "$folded" 2>/dev/null | grep -vc '\.py:')
        backward_py=$(grep 'autograd::Engine' "$folded" 2>/dev/null | grep -c '\.py:')
        left=$(grep -c '_PyEval_EvalFrameDefault' "$folded" 2>/dev/null)
        version=$(grep -o 'with Python [0-9.]* frames' "$work/pyframes.out" | head -1)
        ok=0
        grep -q 'check=ok' "$work/pyframes.out" && grep -q '^exit=0' "$work/pyframes.out" &&
            [ "${forward:-0}" -ge 1 ] && [ "${backward:-0}" -ge 1 ] && [ "${backward_py:-1}" = 0 ] &&
            [ "${left:-1}" = 0 ] && [ -n "$version" ] && ok=1
        result "GPU flame graph with Python frames (PyTorch)" $ok "${version:-no Python frames}; $forward stacks through $path; $backward autograd-thread stacks without Python frames ($backward_py with); ${left:-?} stacks with _PyEval_EvalFrameDefault left; $(wc -l <"$folded" 2>/dev/null) stacks in all"
    else
        result "GPU flame graph with Python frames (PyTorch)" 0 "no PyTorch with CUDA on this machine"
    fi

    # One timeline (`bpftime run --trace`): two_paths under gpu_timeline (a uprobe and a
    # uretprobe on train_step, a uprobe on prepare_batch, probes inside `scale` with a printk
    # at exit): each of the 2 x 10 + 1 launches joined by one flow to its kernel's span,
    # every printk line inside its kernel's span, every launch call before its kernel's
    # start within the bound the trace reports, one stream's kernels in sequence, a span per
    # train_step call (bpftime-trace-check, the same checks as tests/tests/trace.rs). The
    # trace is kept beside the results, for the consumer (tests/trace-consumer) to read.
    log=$work/timeline
    run "$log" --trace "$work/trace-two_paths.json" "$objs/gpu_timeline.bpf.o" -- "$cuda/two_paths" 10
    cp "$work/trace-two_paths.json" "$keep/trace-two_paths.json" 2>/dev/null
    checked=$("$(dirname "$bt")/bpftime-trace-check" "$work/trace-two_paths.json" \
        --launches 21 --gpu-lines 21 --spans 'train_step(Path&, float*, int)=10' 2>&1)
    checker=$?
    ok=0
    [ "$checker" = 0 ] && grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
        [ "$(value "$log.out" counts 0)" = 10 ] && [ "$(value "$log.out" counts 1)" = 10 ] && ok=1
    result "timeline of CPU and GPU probes (bpftime run --trace)" $ok "$checked; $(grep -o 'trace of .*)' "$log.out" | head -1)"

    # Two kernels at once: two_streams under gpu_streams, `spin` on two streams side by side
    # for 10 rounds, a line from each of its 8 blocks naming the launch (`tag=K` for the
    # K-th). Lines are written while both kernels run, so time alone cannot place them: each
    # of the 160 must be on the launch that wrote it (bpftime-trace-check --tagged), inside
    # its kernel's span, with the checks above.
    log=$work/timeline-streams
    run "$log" --trace "$work/trace-two_streams.json" "$objs/gpu_streams.bpf.o" -- "$cuda/two_streams" 10
    checked=$("$(dirname "$bt")/bpftime-trace-check" "$work/trace-two_streams.json" \
        --launches 20 --gpu-lines 160 --tagged 160 2>&1)
    checker=$?
    ok=0
    [ "$checker" = 0 ] && grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" && ok=1
    result "timeline of two kernels at once: lines on the launch that wrote them" $ok "$checked"

    # gpu_printk: a bpf_printk line from inside vectorAdd (one thread, at its exit) per
    # launch, with the GPU's clock in it; the trace pipe stamps the line with the GPU's time
    # of the printk (the record's global timer on CLOCK_MONOTONIC, the clock the line's
    # exit_ns reads), so stamp and exit_ns agree to the stamp's microsecond.
    log=$work/gpu_printk
    run "$log" "$objs/gpu_printk.bpf.o" -- "$cuda/vec_add" 1048576 20
    lines=$(grep -c 'bpf_trace_printk: vectorAdd n=1048576 exit_ns=' "$log.out")
    lat=$(grep 'bpf_trace_printk: vectorAdd n=1048576 exit_ns=' "$log.out" |
        sed 's/.* \([0-9]*\)\.\([0-9]*\): bpf_trace_printk: .*exit_ns=\([0-9]*\).*/\1 \2 \3/' |
        awk '{ printf "%.0f\n", ($1 * 1e9 + $2 * 1e3) - $3 }' | sort -n)
    median=$(awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "" }' <<<"$lat")
    worst=$(tail -1 <<<"$lat")
    best=$(head -1 <<<"$lat")
    ok=0
    [ "$lines" = 20 ] && grep -q 'check=ok' "$log.out" && [ -n "$median" ] &&
        [ "$best" -ge -2000 ] && [ "$worst" -le 10000 ] && ok=1
    result "gpu_printk: a trace line from inside a kernel per launch, stamped with the GPU's time" $ok "$lines lines (expected 20); the pipe's stamp minus the line's exit_ns: median $median ns, best $best ns, worst $worst ns (expected within -2 us .. 10 us: the stamp has microseconds, a re-anchor may fall between)"
    # How long a line takes from the GPU's printk to a reader of `bpftime trace-pipe`
    # (and to bpftime run's own output): each line stamped on CLOCK_MONOTONIC as it
    # arrives, against its exit_ns (the GPU's clock at the printk).
    stamp() { python3 -c 'import sys, time
for line in sys.stdin:
    print(time.monotonic_ns(), line, end="", flush=True)'; }
    latency() {  # latency FILE: arrival minus exit_ns per line, sorted
        grep 'bpf_trace_printk: vectorAdd n=1048576 exit_ns=' "$1" |
            sed 's/^\([0-9]*\) .*exit_ns=\([0-9]*\).*/\1 \2/' | awk '{ print $1 - $2 }' | sort -n
    }
    log=$work/gpu_printk_latency
    pstore="gpu-ex-pipe-$$"
    "$bt" --store "$pstore" trace-pipe 2>/dev/null | stamp >"$log.pipe" &
    reader=$!
    sleep 0.5
    timeout 300 "$bt" --store "$pstore" run "$objs/gpu_printk.bpf.o" -- "$cuda/vec_add" 1048576 20 2>&1 | stamp >"$log.out"
    sleep 0.5
    kill "$reader" 2>/dev/null; pkill -f "store $pstore trace-pipe" 2>/dev/null; wait "$reader" 2>/dev/null
    rm -rf "/dev/shm/bpftime-$pstore"
    for where in pipe out; do
        lat=$(latency "$log.$where")
        lines=$(grep -c . <<<"$lat")
        median=$(awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "" }' <<<"$lat")
        ok=0; [ "$lines" = 20 ] && [ -n "$median" ] && [ "$(head -1 <<<"$lat")" -gt 0 ] && ok=1
        goal=missed; [ -n "$median" ] && [ "$median" -le 1000000 ] && goal=met
        name="bpftime trace-pipe"; [ $where = out ] && name="bpftime run's output"
        result "gpu_printk: from the GPU's printk to the line in $name" $ok "$lines lines (expected 20); median $median ns, best $(head -1 <<<"$lat") ns, worst $(tail -1 <<<"$lat") ns (goal: median <= 1 ms: $goal)"
    done

    # From a module's load to its instrumented module ready, per kernel, with threadhist
    # (an exit probe, one array): the maps' device copies, the probes' compilation (LLVM),
    # the splice, the driver's load of the module (its JIT), and the clock's calibration.
    # The build starts at the load, on a thread of ours; what the application feels is
    # how long its first launch then waits (0 when the build was done by then). Each
    # case has caches of its own, where a run of another tool (a counter) first leaves
    # what any earlier use of bpftime on the machine would (GPU attach's own kernels in
    # the driver's JIT cache). threadhist then runs twice: the first run compiles its
    # probe and the instrumented module; the second finds the same probe code (the maps
    # at the same addresses) in bpftime's cache and the same instrumented PTX in the
    # driver's.
    for app in "vec_add 1048576 2" "matmul 1024 2" "EAGER vec_add 1048576 2" "vec_add_driver $cuda/vec_add.ptx 1048576 2"; do
        set -- $app
        loading=LAZY
        [ "$1" = EAGER ] && { loading=EAGER; shift; }
        exe=$cuda/$1; shift
        kernel=vectorAdd; [ "$(basename "$exe")" = matmul ] && kernel=matmul
        [ "$(basename "$exe")" = vec_add_driver ] && loading=driver-API
        caches=$work/caches-$kernel-$loading
        rm -rf "$caches"
        CUDA_CACHE_PATH=$caches/cuda BPFTIME_CACHE_DIR=$caches/bpftime CUDA_MODULE_LOADING=$loading \
            run "$work/ready-$kernel-$loading-other" --attach count="$kernel" "$objs/bench_count.bpf.o" -- "$exe" "$@"
        for pass in "first run" "second run"; do
            log=$work/ready-$kernel-$loading-${pass% run}
            CUDA_CACHE_PATH=$caches/cuda BPFTIME_CACHE_DIR=$caches/bpftime CUDA_MODULE_LOADING=$loading BPFTIME_LOG=info \
                run "$log" --attach thread_exit="$kernel" "$objs/threadhist.bpf.o" -- "$exe" "$@"
            plain=$(sed 's/\x1b\[[0-9;]*m//g' "$log.out")
            ready=$(grep 'instrumented module ready' <<<"$plain" | head -1 | grep -o 'ms=[0-9.]*' | cut -d= -f2)
            parts=$(grep -E 'probes compiled|instrumented module built' <<<"$plain" | grep -o '[a-z_]*_ms=[0-9.]*' | tr '\n' ' ')
            waited=$(grep 'a launch waited for its instrumented module' <<<"$plain" | head -1 | grep -o 'ms=[0-9.]*' | cut -d= -f2)
            ahead=$(grep -c 'building an instrumented module ahead' <<<"$plain")
            ok=0; [ -n "$ready" ] && grep -q 'check=ok' "$log.out" && ok=1
            goal=missed; awk -v r="${ready:-999}" 'BEGIN { exit !(r <= 20) }' && goal=met
            result "module load to instrumented module ready, $kernel, $loading loading, $pass (measured)" $ok "$ready ms (goal <= 20 ms: $goal): $parts; build started at the load on a thread of ours: $([ "$ahead" -gt 0 ] && echo yes || echo no), first launch waited ${waited:-0} ms"
        done
    done

    # `bpftime attach PID` into a CUDA process started without bpftime: attach_loop loads
    # its module and launches vectorAdd in a loop before the agent arrives (the attach
    # happens while it launches), pauses, an unmodified libbpf tool (gpu_probes: entry,
    # exit and launch probes) is loaded, and then it makes 20 launches of 2^20 threads.
    # The agent finds vectorAdd's PTX in the program's fatbin and instruments it: entries
    # and exits exact for those launches. Without PTX (sm_90 machine code only) the kernel
    # runs as it is, with one notice, and launch events still count every launch.
    wait_for() {  # wait_for FILE PATTERN SECONDS
        local i
        for i in $(seq $(($3 * 20))); do
            grep -q "$2" "$1" 2>/dev/null && return 0
            sleep 0.05
        done
        return 1
    }
    attach_pid() {  # attach_pid TAG LABEL APP PTX(1|0)
        local name=$1 label=$2 app=$3 ptx=$4 n=1048576 launches=20
        local d=$work/attach-$name store=gpu-ex-$$-attach-$name
        mkdir -p "$d"
        BPFTIME_LOG=info timeout 300 "$app" $n $launches "$d" >"$d/app.out" 2>&1 &
        local runner=$! pid="" attached=1 tool="" status
        wait_for "$d/app.out" '^attach_loop ready' 60 &&
            pid=$(sed -n 's/^attach_loop ready pid=\([0-9]*\)$/\1/p' "$d/app.out")
        if [ -n "$pid" ]; then
            timeout 120 "$bt" --store "$store" attach "$pid" >"$d/attach.out" 2>&1
            attached=$?
        fi
        touch "$d/stop"
        if wait_for "$d/app.out" '^attach_loop paused' 60 && [ $attached = 0 ]; then
            LD_LIBRARY_PATH="$objs" "$bt" --store "$store" load "$objs/gpu_probes" --obj "$objs/gpu_probes.bpf.o" >"$d/tool.out" 2>&1 &
            tool=$!
            wait_for "$d/tool.out" '^ready$' 60
            # The agent has taken the tool's three device probes and its launch program.
            local i
            for i in $(seq 600); do
                sed 's/\x1b\[[0-9;]*m//g' "$d/app.out" >"$d/app.plain"
                [ "$(grep -c 'GPU probe link=' "$d/app.plain")" -ge 3 ] &&
                    grep -q 'launch program link=' "$d/app.plain" && break
                sleep 0.05
            done
            sleep 0.2
        fi
        touch "$d/go"
        wait $runner; status=$?
        if [ -n "$tool" ]; then
            # It prints its counts at SIGINT; one that does not go is killed, its counts missing.
            kill -INT $tool 2>/dev/null
            local i
            for i in $(seq 100); do kill -0 $tool 2>/dev/null || break; sleep 0.1; done
            kill -KILL $tool 2>/dev/null
            wait $tool 2>/dev/null
        fi
        rm -rf "/dev/shm/bpftime-$store"
        sed 's/\x1b\[[0-9;]*m//g' "$d/app.out" >"$d/app.plain"
        cat "$d/attach.out" "$d/app.plain" "$d/tool.out" >"$logs/attach-$name.out" 2>/dev/null
        local entries exits elements calls found notices expect=$((launches * n))
        entries=$(sed -n 's/^count\[0\]=//p' "$d/tool.out" 2>/dev/null)
        exits=$(sed -n 's/^count\[1\]=//p' "$d/tool.out" 2>/dev/null)
        elements=$(sed -n 's/^count\[2\]=//p' "$d/tool.out" 2>/dev/null)
        calls=$(sed -n 's/^count\[3\]=//p' "$d/tool.out" 2>/dev/null)
        found=$(grep -c 'kernel loaded before GPU attach started, found' "$d/app.plain")
        notices=$(grep -c '^bpftime: kernel .* runs uninstrumented (launch events still see it): its module was loaded before bpftime attached' "$d/app.plain")
        local ok=0
        if [ $status = 0 ] && [ $attached = 0 ] && grep -q "after_go launches=$launches .*threads=$expect check=ok" "$d/app.plain" &&
            [ "$calls" = $launches ]; then
            if [ "$ptx" = 1 ]; then
                [ "$entries" = $expect ] && [ "$exits" = $expect ] && [ "$elements" = $((expect * n)) ] &&
                    [ "$found" -ge 1 ] && [ "$notices" = 0 ] && ok=1
            else
                [ "$entries" = 0 ] && [ "$exits" = 0 ] && [ "$notices" = 1 ] && ok=1
            fi
        fi
        result "bpftime attach PID into a running CUDA process ($label), probes after the attach" $ok "app exit $status, attach exit $attached ($(head -c 200 "$d/attach.out" | tr '\n' ' ')); $(grep -o 'paused launches=[0-9]*' "$d/app.plain") before the probes; entries $entries exits $exits (expected $([ "$ptx" = 1 ] && echo $expect || echo 0) each), sum of n $elements, launches $calls (expected $launches); PTX found $found, uninstrumented notices $notices"
    }
    attach_pid static "static cudart" "$cuda/attach_loop" 1
    attach_pid shared "shared cudart" "$cuda/attach_loop_shared" 1
    attach_pid noptx "no PTX: one notice, launch events only" "$cuda/attach_loop_noptx" 0

    # Bad input: a kernel that does not exist; a kernel without PTX.
    log=$work/nokernel
    run "$log" --attach thread_exit=doesNotExist "$objs/threadhist.bpf.o" -- "$cuda/vec_add" 4096 2 256
    ok=0; grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
        [ "$(grep -c 'never ran: no kernel this process launched' "$log.out")" = 1 ] && ok=1
    result "a probe on a kernel that does not exist: one notice, the app runs" $ok
    log=$work/noptx
    run "$log" "$objs/threadhist.bpf.o" -- "$cuda/vec_add_noptx" 4096 2 256
    ok=0; grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
        [ "$(grep -c '^bpftime: kernel .* has no PTX' "$log.out")" = 1 ] && ok=1
    result "a kernel without PTX: one notice, the app runs" $ok

    # A tool that exits while the target's kernels run: the unmodified libbpf tool is
    # killed (SIGKILL, no goodbye) two seconds into 100000 launches; its probes are detached
    # from the next launches on, and the application finishes with correct results.
    store=gpu-ex-$$-kill
    LD_LIBRARY_PATH="$objs" "$bt" --store "$store" load "$objs/gpu_probes" --obj "$objs/gpu_probes.bpf.o" >"$work/tool.out" 2>&1 &
    tool=$!
    for _ in $(seq 200); do grep -qx ready "$work/tool.out" && break; sleep 0.05; done
    BPFTIME_LOG=info timeout 300 "$bt" --store "$store" start "$cuda/vec_add" 1048576 100000 >"$work/app.out" 2>&1 &
    app=$!
    sleep 2
    kill -KILL $tool
    wait $tool 2>/dev/null
    wait $app; status=$?
    detached=$(grep -c 'GPU probe detached' "$work/app.out")
    ok=0; [ $status = 0 ] && grep -q 'check=ok' "$work/app.out" && [ "$detached" -ge 3 ] && ok=1
    result "a tool killed while kernels run: probes detached, the app's results correct" $ok "app exit $status, $detached device probes detached, $(grep -o 'check=[a-z]*' "$work/app.out")"
    grep -v '^starts\[' "$work/app.out" | tail -20 >"$logs/tool-killed.out" 2>/dev/null
    rm -rf "/dev/shm/bpftime-$store"

    # A target killed while instrumented kernels run: the tool sees it go, does not hang,
    # and keeps what the syncs brought back. Each launch adds 4096 exits at every index; a
    # sync may catch the next launch part way (its blocks run in any order), and the kill
    # may land while one is adding into the store, key by key, so the indices hold at
    # least one launch each and differ by at most what one sync carries (a few launches:
    # syncs run every 100 µs, a launch takes about 50).
    log=$work/target-killed
    timeout 120 "$bt" --store "gpu-ex-$$" run "$objs/threadhist.bpf.o" -- "$cuda/vec_add" 1048576 100000 256 >"$log.out" 2>&1 &
    runner=$!
    sleep 3
    # The application itself, not `bpftime run` (whose command line names it too).
    pkill -KILL -f "^$cuda/vec_add 1048576 100000 256" 2>/dev/null
    started=$(date +%s)
    wait $runner; status=$?
    took=$(($(date +%s) - started))
    values=$(sed -n 's/^exits_by_thread\[[0-9]*\]: \([0-9]*\)$/\1/p' "$log.out")
    counted=$(grep -c . <<<"$values")
    low=$(sort -n <<<"$values" | head -1) high=$(sort -n <<<"$values" | tail -1)
    ok=0
    [ $status != 124 ] && [ "$took" -le 30 ] && grep -q 'signal: 9' "$log.out" &&
        [ "$counted" = 256 ] && [ "${low:-0}" -ge 4096 ] && [ $((high - low)) -le $((4 * 4096)) ] && ok=1
    result "a target killed mid-kernel: the tool reports it and keeps the synced counts" $ok "bpftime run exit $status after ${took}s, $counted indices with counts, from $low to $high exits (one launch is 4096)"
    grep -v '^starts\[' "$log.out" | tail -20 >"$logs/target-killed.out" 2>/dev/null

    echo "$passed passed, $failed failed"
} | tee "$out"
grep -q ' 0 failed$' "$out"
