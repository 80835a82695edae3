# a misaligned 4-byte read of pt_regs
#@ type kprobe
#@ intent reject
ldxw %r0, [%r1+2]
exit
