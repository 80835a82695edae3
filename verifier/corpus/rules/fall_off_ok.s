# the program ends in exit
#@ type kprobe
#@ intent accept
mov %r0, 0
exit
