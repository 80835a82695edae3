# an aligned 4-byte read of a pt_regs field
#@ type kprobe
#@ intent accept
ldxw %r0, [%r1+4]
exit
