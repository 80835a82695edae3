# perf_event_output of zero bytes at the frame pointer: outside the frame
#@ type kprobe
#@ intent reject
#@ map ev perf_event_array 4 4 4
ldmap %r2, ev
lddw %r3, 0xffffffff
mov %r4, %r10
mov %r5, 0
call 25
mov %r0, 0
exit
