# a 1-byte read at any offset inside pt_regs
#@ type kprobe
#@ intent accept
ldxb %r0, [%r1+3]
exit
