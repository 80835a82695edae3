# a known opcode
#@ type kprobe
#@ intent accept
mov %r0, 1
exit
