# In the environment fresh_clone.sh left (`bash benchmarks/fresh_clone.sh REPO CLONE` ran
# first, its output in fresh-clone.txt), at 89ee1b7 (the steps as benchmarks/readme_steps.sh
# now holds them); the exits and times are steps.txt, the outputs outputs/:
bash benchmarks/readme_steps.sh CLONE OUT
