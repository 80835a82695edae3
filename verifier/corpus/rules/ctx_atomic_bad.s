# an atomic add on pt_regs
#@ type kprobe
#@ intent reject
mov %r2, 1
lock add [%r1+8], %r2
mov %r0, 0
exit
