# a jump to the last instruction
#@ type kprobe
#@ intent accept
mov %r0, 0
ja +0
exit
