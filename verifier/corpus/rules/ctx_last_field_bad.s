# 8 bytes at 164 straddle the end of pt_regs
#@ type kprobe
#@ intent reject
ldxdw %r0, [%r1+164]
exit
