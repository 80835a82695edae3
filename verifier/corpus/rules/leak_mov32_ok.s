# the low half of a pointer is a number to privileged programs
#@ type kprobe
#@ intent accept
mov32 %r0, %r10
exit
