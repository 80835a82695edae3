# perf_event_output of zero bytes from inside the stack frame
#@ type kprobe
#@ intent accept
#@ map ev perf_event_array 4 4 4
ldmap %r2, ev
lddw %r3, 0xffffffff
mov %r4, %r10
add %r4, -8
mov %r5, 0
call 25
mov %r0, 0
exit
