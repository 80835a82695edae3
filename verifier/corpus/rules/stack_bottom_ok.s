# the lowest slot, 512 bytes down
#@ type kprobe
#@ intent accept
stdw [%r10-512], 1
ldxdw %r0, [%r10-512]
exit
