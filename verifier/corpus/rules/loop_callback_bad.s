# bpf_loop with a callback that returns 2
#@ type kprobe
#@ intent reject
mov %r1, 10
ldfunc %r2, 6
mov %r3, 0
mov %r4, 0
call 181
mov %r0, 0
exit
mov %r0, 2
exit
