# the last 8 bytes of pt_regs
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+160]
exit
