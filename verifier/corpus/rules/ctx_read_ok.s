# a kprobe reads a pt_regs field through its context pointer
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+112]
exit
