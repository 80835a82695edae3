# fetch-and-add returns the old value in the source register
#@ type kprobe
#@ intent accept
stdw [%r10-8], 5
mov %r1, 1
lock fetch add [%r10-8], %r1
mov %r0, %r1
exit
