# store an immediate into pt_regs
#@ type kprobe
#@ intent reject
stdw [%r1+8], 7
mov %r0, 0
exit
