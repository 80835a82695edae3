# a helper that exists
#@ type kprobe
#@ intent accept
call 5
exit
