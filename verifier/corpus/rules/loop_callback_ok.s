# bpf_loop with a callback that returns 0
#@ type kprobe
#@ intent accept
mov %r1, 10
ldfunc %r2, 6
mov %r3, 0
mov %r4, 0
call 181
mov %r0, 0
exit
mov %r0, 0
exit
