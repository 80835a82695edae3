# an aligned 4-byte slot
#@ type kprobe
#@ intent accept
stw [%r10-8], 1
ldxw %r0, [%r10-8]
exit
