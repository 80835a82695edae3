# reading past the end of pt_regs (168 bytes)
#@ type kprobe
#@ intent reject
ldxdw %r0, [%r1+168]
exit
