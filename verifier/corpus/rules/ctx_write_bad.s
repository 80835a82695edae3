# pt_regs is read-only for kprobes
#@ type kprobe
#@ intent reject
mov %r2, 7
stxdw [%r1+8], %r2
mov %r0, 0
exit
