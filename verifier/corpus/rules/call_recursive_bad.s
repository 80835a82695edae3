# a function that calls itself
#@ type kprobe
#@ intent reject
mov %r1, 3
call local f
exit
f:
mov %r0, 0
jeq %r1, 0, done
add %r1, -1
call local f
done:
exit
