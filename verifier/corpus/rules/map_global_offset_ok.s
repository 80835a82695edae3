# the address of a global inside the section
#@ type kprobe
#@ intent accept
#@ map bss array 4 16 1
ldmapval %r1, bss, 0
ldxdw %r0, [%r1+8]
exit
