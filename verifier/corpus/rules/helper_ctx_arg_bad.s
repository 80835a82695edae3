# perf_event_output gets a stack pointer in r1
#@ type kprobe
#@ intent reject
#@ map ev perf_event_array 4 4 4
stdw [%r10-8], 1
mov %r1, %r10
add %r1, -8
ldmap %r2, ev
lddw %r3, 0xffffffff
mov %r4, %r10
add %r4, -8
mov %r5, 8
call 25
mov %r0, 0
exit
